// Package stack holds the test of `make up` / `make down`
// (scripts/stack.sh): the native local stack a user starts by hand.
package stack
