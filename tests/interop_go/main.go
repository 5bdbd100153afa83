// A second, independent check of the gateway's audit proofs and checkpoints with Go's
// golang.org/x/mod/sumdb/tlog and sumdb/note (Debian: golang-golang-x-mod-dev), built with
// GO111MODULE=off GOPATH=/usr/share/gocode by tests/audit/test_interop_go.py.
//
// Reads one JSON object on stdin:
//
//	{"vkey": "<name>+<id>+<key>", "checkpoint": "<signed note>", "rows": ["<base64 row>", ...],
//	 "inclusion": [{"row": "<base64>", "proof": {"index", "tree_size", "hashes"}}],
//	 "consistency": [{"old": "<signed note>", "proof": {"old_size", "new_size", "hashes"}}]}
//
// and prints "ok" (exit 0) when every signature, root and proof holds, else the first failure (exit 1).
package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

type proof struct {
	Index    int64    `json:"index"`
	TreeSize int64    `json:"tree_size"`
	OldSize  int64    `json:"old_size"`
	NewSize  int64    `json:"new_size"`
	Hashes   []string `json:"hashes"`
}

type input struct {
	Vkey       string   `json:"vkey"`
	Checkpoint string   `json:"checkpoint"`
	Rows       []string `json:"rows"`
	Inclusion  []struct {
		Row   string `json:"row"`
		Proof proof  `json:"proof"`
	} `json:"inclusion"`
	Consistency []struct {
		Old   string `json:"old"`
		Proof proof  `json:"proof"`
	} `json:"consistency"`
}

func fail(format string, args ...interface{}) {
	fmt.Printf(format+"\n", args...)
	os.Exit(1)
}

func open(verifier note.Verifier, text string) (int64, tlog.Hash) {
	msg, err := note.Open([]byte(text), note.VerifierList(verifier))
	if err != nil {
		fail("note.Open: %v", err)
	}
	lines := strings.Split(msg.Text, "\n")
	if len(lines) < 4 || lines[0] != verifier.Name() {
		fail("not a checkpoint of %s: %q", verifier.Name(), msg.Text)
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("tree size: %v", err)
	}
	root, err := tlog.ParseHash(lines[2])
	if err != nil {
		fail("root hash: %v", err)
	}
	return size, root
}

func hashes(encoded []string) []tlog.Hash {
	out := make([]tlog.Hash, len(encoded))
	for i, e := range encoded {
		h, err := tlog.ParseHash(e)
		if err != nil {
			fail("proof hash %d: %v", i, err)
		}
		out[i] = h
	}
	return out
}

type memory []tlog.Hash

func (m memory) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		out[i] = m[x]
	}
	return out, nil
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fail("input: %v", err)
	}
	verifier, err := note.NewVerifier(in.Vkey)
	if err != nil {
		fail("note.NewVerifier: %v", err)
	}
	size, root := open(verifier, in.Checkpoint)
	if len(in.Rows) > 0 {
		// Go's own tree over the rows must have the signed root
		var stored memory
		for n, encoded := range in.Rows {
			data, err := base64.StdEncoding.DecodeString(encoded)
			if err != nil {
				fail("row %d: %v", n, err)
			}
			more, err := tlog.StoredHashes(int64(n), data, stored)
			if err != nil {
				fail("tlog.StoredHashes: %v", err)
			}
			stored = append(stored, more...)
		}
		computed, err := tlog.TreeHash(size, stored)
		if err != nil {
			fail("tlog.TreeHash: %v", err)
		}
		if computed != root {
			fail("tlog.TreeHash of the rows is %v, the checkpoint signs %v", computed, root)
		}
	}
	for _, c := range in.Inclusion {
		data, err := base64.StdEncoding.DecodeString(c.Row)
		if err != nil {
			fail("row: %v", err)
		}
		if c.Proof.TreeSize != size {
			fail("inclusion proof for size %d, checkpoint %d", c.Proof.TreeSize, size)
		}
		if err := tlog.CheckRecord(hashes(c.Proof.Hashes), size, root, c.Proof.Index, tlog.RecordHash(data)); err != nil {
			fail("tlog.CheckRecord(%d): %v", c.Proof.Index, err)
		}
	}
	for _, c := range in.Consistency {
		oldSize, oldRoot := open(verifier, c.Old)
		if c.Proof.OldSize != oldSize || c.Proof.NewSize != size {
			fail("consistency proof %d..%d for checkpoints %d..%d", c.Proof.OldSize, c.Proof.NewSize, oldSize, size)
		}
		if err := tlog.CheckTree(hashes(c.Proof.Hashes), size, root, oldSize, oldRoot); err != nil {
			fail("tlog.CheckTree(%d, %d): %v", oldSize, size, err)
		}
	}
	fmt.Println("ok")
}
