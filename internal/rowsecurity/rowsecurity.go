// Package rowsecurity says whether row-level security would hide rows of a
// table from the role reading it. Every reader of the outbox table (poll
// mode, the initial snapshot, slot recovery, backfill) publishes what it
// reads and nothing else: a policy that filters rows for its role would
// make it skip events silently, and its "done" would be a lie. So each
// refuses at start where a policy could apply, and sets row_security off on
// its session, which makes the server raise an error instead of filtering
// should a policy be enabled later (the way pg_dump protects a dump).
package rowsecurity

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrApplies says row-level security applies to the reader's role on the
// table, so that its reads could skip rows; the text says how to fix it.
var ErrApplies = errors.New("row-level security applies to this role on the outbox table")

// Querier is what Check needs (*pgx.Conn, *pgxpool.Pool and pgx.Tx have it).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// query tells, for the table $1 and the current user, whether row-level
// security is on, whether it applies to the user (PostgreSQL's own rule in
// check_enable_rls: not to a superuser or a BYPASSRLS role, nor to the
// table's owner, or a member of it, unless FORCE ROW LEVEL SECURITY), and
// the names of the role and the owner for the message.
const query = `SELECT c.relrowsecurity
       AND NOT r.rolsuper AND NOT r.rolbypassrls
       AND (c.relforcerowsecurity OR NOT pg_has_role(current_user, c.relowner, 'USAGE')),
       current_user::text, pg_get_userbyid(c.relowner)::text, c.relforcerowsecurity
FROM pg_class c, pg_roles r
WHERE c.oid = $1::regclass AND r.rolname = current_user`

// Check returns an error wrapping ErrApplies when row-level security could
// hide rows of table (schema-qualified, quoted as SQL needs) from the
// current role. what names the reader for the message ("poll mode").
func Check(ctx context.Context, q Querier, table, what string) error {
	var applies, force bool
	var role, owner string
	if err := q.QueryRow(ctx, query, table).Scan(&applies, &role, &owner, &force); err != nil {
		return fmt.Errorf("%s: check row-level security on %s: %w", what, table, err)
	}
	if !applies {
		return nil
	}
	fix := fmt.Sprintf("ALTER ROLE %s BYPASSRLS (as a superuser), or run it as the table's owner %s", pgx.Identifier{role}.Sanitize(), pgx.Identifier{owner}.Sanitize())
	if force {
		fix = fmt.Sprintf("ALTER ROLE %s BYPASSRLS (as a superuser; FORCE ROW LEVEL SECURITY applies it to the owner too)", pgx.Identifier{role}.Sanitize())
	}
	return fmt.Errorf("%w: %s reads %s as role %s, to which its policies apply, so rows they hide would be skipped without a word and their events never published; %s, or ALTER TABLE %s DISABLE ROW LEVEL SECURITY",
		ErrApplies, what, table, role, fix, table)
}

// Off is the statement that makes the session's reads fail rather than be
// filtered, should a policy start to apply after Check.
const Off = "SET row_security = off"
