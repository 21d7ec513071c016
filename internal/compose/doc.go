// Package compose holds the check of docker-compose.yml: Docker cannot run
// on the build machines, so a test loads the file and checks that it names
// the services, settings and files that exist.
package compose
