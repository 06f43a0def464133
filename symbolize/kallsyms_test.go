package symbolize

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testKallsyms is out of order, as /proc/kallsyms is once modules are listed, and has
// aliases, data symbols and a module.
const testKallsyms = `ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81001000 t do_one_initcall
ffffffff81002000 W arch_cpu_idle
ffffffff81002100 T schedule
ffffffff81003000 T _etext
ffffffff82000000 D jiffies
ffffffff82000100 b some_bss
ffffffffc0a00000 t ext4_map_blocks	[ext4]
ffffffffc0a00400 T ext4_file_write_iter	[ext4]
ffffffffc0a00800 d ext4_data	[ext4]
ffffffffc0900000 t bpf_prog_6deef7357e7b4530_sd_fw_ingress	[bpf]
`

func TestParseKallsyms(t *testing.T) {
	ks, err := ParseKallsyms(strings.NewReader(testKallsyms))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ks.Len(), 8; got != want {
		t.Errorf("Len() = %d, want %d", got, want)
	}
	for _, tc := range []struct {
		addr         uint64
		name, module string
	}{
		{0xffffffff80ffffff, "", ""},
		{0xffffffff81000000, "_text", ""}, // global, then shortest, then smallest
		{0xffffffff81000fff, "_text", ""},
		{0xffffffff81001234, "do_one_initcall", ""},
		{0xffffffff81002050, "arch_cpu_idle", ""},
		{0xffffffff81002fff, "schedule", ""},
		{0xffffffff81003000, "_etext", ""},
		{0xffffffff82000000, "", ""}, // data is not code: past _etext's bound
		{0xffffffffc0900010, "bpf_prog_6deef7357e7b4530_sd_fw_ingress", "bpf"},
		{0xffffffffc0910000, "", ""}, // past the last of a module: maybe a new one
		{0xffffffffc0a00010, "ext4_map_blocks", "ext4"},
		{0xffffffffc0a00900, "ext4_file_write_iter", "ext4"}, // module data is dropped
		{0xffffffffc0a00400 + maxTrailingExtent, "", ""},
	} {
		got, ok := ks.Lookup(tc.addr)
		if tc.name == "" {
			if ok {
				t.Errorf("Lookup(%#x) = %+v, want none", tc.addr, got)
			}
			continue
		}
		if !ok || got.Name != tc.name || got.Module != tc.module {
			t.Errorf("Lookup(%#x) = %+v, %v; want %s [%s]", tc.addr, got, ok, tc.name, tc.module)
		}
	}
}

func TestParseKallsymsHidden(t *testing.T) {
	hidden := `0000000000000000 T _stext
0000000000000000 t do_one_initcall
0000000000000000 t ext4_map_blocks	[ext4]
`
	if _, err := ParseKallsyms(strings.NewReader(hidden)); !errors.Is(err, ErrKernelAddressesHidden) {
		t.Fatalf("err = %v, want ErrKernelAddressesHidden", err)
	}
	path := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(path, []byte(hidden), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKallsyms(path); !errors.Is(err, ErrKernelAddressesHidden) {
		t.Fatalf("LoadKallsyms: err = %v, want ErrKernelAddressesHidden", err)
	}
}

func TestParseKallsymsBad(t *testing.T) {
	for _, in := range []string{
		"",
		"ffffffff82000000 D jiffies\n",
		"ffffffff81000000T _stext\n",
		"zzzz T _stext\n",
		"ffffffff81000000 T \n",
	} {
		if _, err := ParseKallsyms(strings.NewReader(in)); err == nil {
			t.Errorf("ParseKallsyms(%q) succeeded", in)
		}
	}
	if _, err := LoadKallsyms(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("LoadKallsyms of a missing file succeeded")
	}
}
