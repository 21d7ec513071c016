package localenv

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// PGVersionBinDir returns the server binaries (initdb, pg_ctl, postgres) of
// PostgreSQL major (13 to 18), for PGOptions.BinDir: Debian's when its
// package is installed, else zonky's embedded-postgres build from Maven
// Central, which scripts/pgversions.sh unpacks into the cache on first use.
func PGVersionBinDir(major int) (string, error) {
	script := filepath.Join(RepoRoot(), "scripts", "pgversions.sh")
	cmd := exec.Command(script, "bin", strconv.Itoa(major))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/pgversions.sh bin %d: %w: %s", major, err, strings.TrimSpace(stderr.String()))
	}
	dir := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(dir, "postgres")); err != nil {
		return "", fmt.Errorf("PostgreSQL %d: no server in %q: %w", major, dir, err)
	}
	return dir, nil
}

// ClientBin is the path of a client program (psql, pg_recvlogical): from the
// cluster's own bin directory when it has one, else from the default
// installation (PGBinDir). zonky's builds ship only the server; the clients
// of a newer major speak to every older server, and the replication
// protocol's commands they use are the same from 13 to 18.
func (pg *Postgres) ClientBin(name string) string {
	own := filepath.Join(pg.BinDir, name)
	if _, err := os.Stat(own); err == nil {
		return own
	}
	if def, err := PGBinDir(); err == nil {
		return filepath.Join(def, name)
	}
	return own
}

// othersCanReach says whether a user other than the owner can walk down to
// path: every directory on the way has the execute bit for others. The cache
// under /root is not, and initdb refuses to run as root, so a server run as
// the postgres user could not load its own binaries from there.
func othersCanReach(path string) bool {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if p == filepath.Dir(p) {
			return true
		}
	}
}

// stageInstall makes the installation that holds bin (its parent: bin/,
// lib/, share/, which a relocatable build finds relative to its binaries)
// reachable under dst, and returns dst's bin. Files are hard links (copies
// across file systems): a few milliseconds, and no second copy on disk. The
// links share the cache's inodes, whose modes already let others read and
// execute them; their owner is left alone, since changing it would change
// the cache's files.
func stageInstall(bin, dst string) (string, error) {
	src := filepath.Dir(filepath.Clean(bin))
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			if err := os.Link(path, target); err == nil {
				return nil
			}
			return copyFile(path, target)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("stage %s for the postgres user: %w", src, err)
	}
	return filepath.Join(dst, filepath.Base(filepath.Clean(bin))), nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// errNoServer reports a bin directory without the server programs.
var errNoServer = errors.New("no initdb, pg_ctl and postgres")

func checkServerBin(bin string) error {
	for _, p := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(bin, p)); err != nil {
			return fmt.Errorf("%s: %w (%s missing)", bin, errNoServer, p)
		}
	}
	return nil
}
