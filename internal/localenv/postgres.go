// Package localenv starts and finds the real services on this machine
// without a test: throwaway PostgreSQL clusters (initdb in a temp dir,
// wal_level=logical, a free port), a JDK, a broker that answers. The tests
// reach it through internal/testenv, which adds what needs a testing.TB; the
// demo and the bench, which are programs, use it directly and so link no
// test helper and not the testing package.
package localenv

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// RepoRoot is the module root, found from this source file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// PGBinDir finds the server binaries of the newest installed PostgreSQL.
func PGBinDir() (string, error) {
	if d := os.Getenv("OUTBOX_TEST_PG_BIN"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var found []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			found = append(found, d)
		}
	}
	if len(found) == 0 {
		return "", errors.New("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin; run scripts/install.sh (apt-get install postgresql)")
	}
	sort.Slice(found, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(found[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(found[j])))
		return vi < vj
	})
	return found[len(found)-1], nil
}

// FreePort asks the kernel for a free TCP port on the loopback interface.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PGOptions tune a throwaway cluster.
type PGOptions struct {
	// Settings are extra postgresql.conf lines (name -> value).
	Settings map[string]string
	// NoSchema skips applying sql/ to the outbox database.
	NoSchema bool
	// Fsync keeps fsync on (benchmarks); tests default to off for speed:
	// a process crash (what the fault tests inject) loses nothing either way.
	Fsync bool
	// BinDir holds the server binaries (initdb, pg_ctl, postgres) to run;
	// empty means PGBinDir(). PGVersionBinDir finds those of a given major.
	BinDir string
	// HBA are pg_hba.conf lines placed before the default trust rules
	// (the first line that matches decides), e.g. hostssl rules for a role.
	HBA []string
	// Files are written into the data directory, owned by the server's
	// user with mode 0600, before the server starts: certificates and keys
	// that Settings name relative to it (ssl_cert_file = 'server.crt').
	Files map[string][]byte
}

// Postgres is one throwaway cluster. The superuser is "postgres" and the
// database the schema is applied to is "outbox"; auth is trust on loopback.
type Postgres struct {
	Dir     string
	Port    int
	BinDir  string
	Version string // server_version, e.g. "15.18 (Debian 15.18-0+deb12u1)"

	uid, gid int
	asUser   bool
	mu       sync.Mutex
	running  bool
}

// NewPostgres initdb's and starts a cluster and applies sql/ to the
// database "outbox" (unless opts.NoSchema); the caller must call Destroy
// (testenv.StartPostgres does, at the test's end).
func NewPostgres(opts PGOptions) (*Postgres, error) {
	bin := opts.BinDir
	if bin == "" {
		var err error
		if bin, err = PGBinDir(); err != nil {
			return nil, err
		}
	}
	if err := checkServerBin(bin); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		return nil, err
	}
	pg := &Postgres{Dir: dir, BinDir: bin}
	if os.Geteuid() == 0 {
		// initdb refuses to run as root: run the server as the postgres user.
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root needs a postgres user (apt-get install postgresql creates it): %w", err)
		}
		pg.uid, _ = strconv.Atoi(u.Uid)
		pg.gid, _ = strconv.Atoi(u.Gid)
		pg.asUser = true
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, err
		}
		if err := os.Chown(dir, pg.uid, pg.gid); err != nil {
			return nil, err
		}
		if !othersCanReach(bin) {
			// Binaries unpacked into root's cache (scripts/pgversions.sh).
			if pg.BinDir, err = stageInstall(bin, filepath.Join(dir, "install")); err != nil {
				os.RemoveAll(dir)
				return nil, err
			}
			bin = pg.BinDir
		}
	}
	data := filepath.Join(dir, "data")
	// -N: no fsync of the new cluster (the tests' servers run with fsync
	// off too). No --no-instructions: 13's initdb does not know it.
	if out, err := pg.run(bin+"/initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "-N", "--locale=C"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	pg.Port = port
	conf := map[string]string{
		"listen_addresses":        "'127.0.0.1'",
		"port":                    strconv.Itoa(port),
		"unix_socket_directories": "'" + dir + "'",
		"wal_level":               "logical",
		"max_replication_slots":   "20",
		"max_wal_senders":         "20",
		"max_connections":         "200",
		"shared_buffers":          "128MB",
		"logging_collector":       "off",
		"log_min_messages":        "warning",
		"synchronous_commit":      "on",
	}
	if !opts.Fsync {
		conf["fsync"] = "off"
		conf["full_page_writes"] = "off"
	}
	for k, v := range opts.Settings {
		conf[k] = v
	}
	var b strings.Builder
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, conf[k])
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteString("\n# testenv\n" + b.String()); err != nil {
		f.Close()
		return nil, err
	}
	f.Close()
	hba := "local all all trust\nhost all all 127.0.0.1/32 trust\nlocal replication all trust\nhost replication all 127.0.0.1/32 trust\n"
	if len(opts.HBA) > 0 {
		hba = strings.Join(opts.HBA, "\n") + "\n" + hba
	}
	files := map[string][]byte{"pg_hba.conf": []byte(hba)}
	for name, b := range opts.Files {
		files[name] = b
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(data, name), b, 0o600); err != nil {
			return nil, err
		}
		if pg.asUser {
			_ = os.Chown(filepath.Join(data, name), pg.uid, pg.gid)
		}
	}
	if err := pg.Start(); err != nil {
		pg.Destroy()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
	if err != nil {
		pg.Destroy()
		return nil, err
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&pg.Version); err != nil {
		pg.Destroy()
		return nil, err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE outbox"); err != nil {
		pg.Destroy()
		return nil, err
	}
	if !opts.NoSchema {
		if err := pg.ApplySchema("outbox"); err != nil {
			pg.Destroy()
			return nil, err
		}
	}
	return pg, nil
}

func (pg *Postgres) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	if pg.asUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(pg.uid), Gid: uint32(pg.gid)}}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Dir = pg.Dir
	return cmd.CombinedOutput()
}

// DSN is a libpq URL for db as the superuser.
func (pg *Postgres) DSN(db string) string {
	return pg.DSNUser(db, "postgres")
}

// DSNUser is a libpq URL for db as user (trust auth, no password).
func (pg *Postgres) DSNUser(db, user string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", user, pg.Port, db)
}

// Start starts the server (again, after Stop).
func (pg *Postgres) Start() error {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	out, err := pg.run(pg.BinDir+"/pg_ctl", "-D", filepath.Join(pg.Dir, "data"), "-l", filepath.Join(pg.Dir, "server.log"), "-w", "-t", "60", "start")
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(pg.Dir, "server.log"))
		return fmt.Errorf("pg_ctl start: %w: %s\n%s", err, out, tail(log, 2000))
	}
	pg.running = true
	return nil
}

// Stop stops the server with the given pg_ctl mode (smart, fast, immediate).
func (pg *Postgres) Stop(mode string) error {
	pg.mu.Lock()
	defer pg.mu.Unlock()
	if !pg.running {
		return nil
	}
	out, err := pg.run(pg.BinDir+"/pg_ctl", "-D", filepath.Join(pg.Dir, "data"), "-m", mode, "-w", "-t", "60", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w: %s", mode, err, out)
	}
	pg.running = false
	return nil
}

// Destroy stops the server and removes the cluster.
func (pg *Postgres) Destroy() {
	_ = pg.Stop("immediate")
	_ = os.RemoveAll(pg.Dir)
}

// Log returns the tail of the server log, for failure messages.
func (pg *Postgres) Log() string {
	b, _ := os.ReadFile(filepath.Join(pg.Dir, "server.log"))
	return tail(b, 4000)
}

// ApplySchema applies sql/*.sql in lexical order with psql -v ON_ERROR_STOP=1.
func (pg *Postgres) ApplySchema(db string) error {
	files, err := SchemaFiles()
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := pg.Psql(db, "-f", f); err != nil {
			return err
		}
	}
	return nil
}

// SchemaFiles lists sql/*.sql (not sub-folders) in lexical order.
func SchemaFiles() ([]string, error) {
	files, err := filepath.Glob(filepath.Join(RepoRoot(), "sql", "*.sql"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, errors.New("no sql/*.sql files")
	}
	return files, nil
}

// Psql runs psql against db with extra arguments.
func (pg *Postgres) Psql(db string, args ...string) error {
	psql := pg.ClientBin("psql")
	full := append([]string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", pg.DSN(db)}, args...)
	out, err := exec.Command(psql, full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("psql %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// NewStandby makes a physical standby of pg, streaming from it: a
// pg_basebackup (-R: standby.signal and primary_conninfo, naming the
// database outbox as slot synchronization needs) of the running cluster
// into a new directory, on its own port, started. zonky's builds have no
// pg_basebackup, and Debian's refuses a newer server: for those the copy is
// taken with the primary stopped cleanly (a file-system backup), and the
// same two settings written. settings are extra postgresql.conf lines of
// the standby (primary_slot_name, sync_replication_slots). The caller must
// call Destroy.
func (pg *Postgres) NewStandby(settings map[string]string) (*Postgres, error) {
	dir, err := os.MkdirTemp("", "outbox-pg-standby-")
	if err != nil {
		return nil, err
	}
	sb := &Postgres{Dir: dir, BinDir: pg.BinDir, Version: pg.Version, uid: pg.uid, gid: pg.gid, asUser: pg.asUser}
	if sb.asUser {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, err
		}
		if err := os.Chown(dir, sb.uid, sb.gid); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=outbox", pg.Port)
	basebackup := pg.ClientBin("pg_basebackup")
	if out, err := exec.Command(basebackup, "--version").Output(); err == nil && sameMajor(string(out), pg.Version) {
		if out, err := sb.run(basebackup, "-D", data, "-d", conninfo, "-X", "stream", "-R", "-c", "fast", "-N"); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pg_basebackup: %w: %s", err, out)
		}
	} else if err := pg.coldCopy(sb, data, conninfo); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if sb.Port, err = FreePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	conf := map[string]string{"port": strconv.Itoa(sb.Port), "unix_socket_directories": "'" + dir + "'", "hot_standby": "on"}
	for k, v := range settings {
		conf[k] = v
	}
	var b strings.Builder
	b.WriteString("\n# testenv standby\n")
	for _, k := range slices.Sorted(maps.Keys(conf)) {
		fmt.Fprintf(&b, "%s = %s\n", k, conf[k])
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	_, err = f.WriteString(b.String())
	f.Close()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := sb.Start(); err != nil {
		sb.Destroy()
		return nil, err
	}
	return sb, nil
}

// sameMajor says whether a client's --version output ("pg_basebackup
// (PostgreSQL) 15.18") and a server_version ("15.18 (Debian ...)") are of
// one major release.
func sameMajor(clientVersion, serverVersion string) bool {
	f := strings.Fields(clientVersion)
	if len(f) == 0 {
		return false
	}
	major := func(v string) string { return strings.SplitN(v, ".", 2)[0] }
	return major(f[len(f)-1]) == major(serverVersion)
}

// coldCopy copies pg's data directory into data with pg stopped cleanly
// (started again after), and makes the copy a standby of pg.
func (pg *Postgres) coldCopy(sb *Postgres, data, conninfo string) error {
	if err := pg.Stop("fast"); err != nil {
		return err
	}
	out, err := sb.run("cp", "-a", filepath.Join(pg.Dir, "data"), data)
	if err2 := pg.Start(); err == nil && err2 != nil {
		return err2
	}
	if err != nil {
		return fmt.Errorf("copy the data directory: %w: %s", err, out)
	}
	files := map[string]string{
		"standby.signal":       "",
		"postgresql.auto.conf": fmt.Sprintf("primary_conninfo = '%s'\n", conninfo),
	}
	for name, content := range files {
		f, err := os.OpenFile(filepath.Join(data, name), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = f.WriteString(content)
		f.Close()
		if err != nil {
			return err
		}
		if sb.asUser {
			_ = os.Chown(filepath.Join(data, name), sb.uid, sb.gid)
		}
	}
	return nil
}

// Promote promotes a standby to a primary and waits until it is one.
func (pg *Postgres) Promote() error {
	out, err := pg.run(pg.BinDir+"/pg_ctl", "-D", filepath.Join(pg.Dir, "data"), "-w", "-t", "60", "promote")
	if err != nil {
		return fmt.Errorf("pg_ctl promote: %w: %s", err, out)
	}
	return nil
}
