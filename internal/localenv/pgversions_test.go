package localenv

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestStageInstall stages an installation kept in a directory others cannot
// enter (as root's cache is): the staged tree is reachable, its files are
// the same inodes, and relative library links still resolve.
func TestStageInstall(t *testing.T) {
	root := t.TempDir()
	private := filepath.Join(root, "private")
	src := filepath.Join(private, "postgresql-18")
	for _, d := range []string{"bin", "lib/postgresql", "share/postgresql"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]os.FileMode{"bin/postgres": 0o755, "lib/libpq.so.5.18": 0o644, "share/postgresql/postgres.bki": 0o644}
	for f, mode := range files {
		if err := os.WriteFile(filepath.Join(src, f), []byte(f), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("libpq.so.5.18", filepath.Join(src, "lib/libpq.so.5")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if othersCanReach(filepath.Join(src, "bin")) {
		t.Fatalf("%s is reachable through a 0700 directory", src)
	}

	dst := filepath.Join(root, "install")
	bin, err := stageInstall(filepath.Join(src, "bin"), dst)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dst, "bin"); bin != want {
		t.Fatalf("staged bin %s, want %s", bin, want)
	}
	// dst lies in the cluster's directory, which the postgres user owns;
	// below it, others may enter every directory.
	for _, d := range []string{"bin", "lib", "lib/postgresql", "share/postgresql"} {
		fi, err := os.Stat(filepath.Join(dst, d))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			t.Errorf("staged %s has mode %v; want others to enter it", d, fi.Mode())
		}
	}
	for f, mode := range files {
		a, err := os.Stat(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.Stat(filepath.Join(dst, f))
		if err != nil {
			t.Fatal(err)
		}
		if b.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", f, b.Mode().Perm(), mode)
		}
		if a.Sys().(*syscall.Stat_t).Ino != b.Sys().(*syscall.Stat_t).Ino {
			t.Errorf("%s: staged as a copy, want a hard link on one file system", f)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dst, "lib/libpq.so.5")); err != nil || string(got) != "lib/libpq.so.5.18" {
		t.Errorf("lib/libpq.so.5 -> %q, %v; want the staged library", got, err)
	}
}
