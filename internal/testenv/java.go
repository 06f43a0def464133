package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// JDK is a Java development kit the tests can run: its java and javac.
type JDK struct {
	Name  string // "17 (Debian)"
	Major int
	Home  string
}

// Java is the JDK's java launcher.
func (j JDK) Java() string { return filepath.Join(j.Home, "bin", "java") }

// Javac is the JDK's compiler.
func (j JDK) Javac() string { return filepath.Join(j.Home, "bin", "javac") }

// JDKs are where the tests find the JDKs whose HotSpot they read: Debian's JDK 17 and
// Temurin's 25 (.ci/run installs both). HotSpot's layout changed between them (code
// blobs, nmethods' debug info, ConstMethod's flags), so each is run.
var JDKs = []JDK{
	{Name: "17 (Debian openjdk-17-jdk)", Major: 17, Home: "/usr/lib/jvm/java-17-openjdk-amd64"},
	{Name: "25 (Temurin)", Major: 25, Home: "/usr/lib/jvm/temurin-25-jdk-amd64"},
}

// RequireJDK stops the test unless jdk's java and javac are installed: in CI it fails.
func RequireJDK(t testing.TB, jdk JDK) {
	t.Helper()
	for _, p := range []string{jdk.Java(), jdk.Javac()} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			Unavailable(t, "needs JDK %s at %s", jdk.Name, jdk.Home)
		}
	}
}
