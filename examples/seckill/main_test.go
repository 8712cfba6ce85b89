package main

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }

func TestExample(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), redistest.Client(t), redistest.Name(t), &out); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "orders 20, vouchers left 0\n" {
		t.Fatalf("output %q, want %q", got, "orders 20, vouchers left 0\n")
	}
}
