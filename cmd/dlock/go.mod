module github.com/dlock-go/dlock/cmd/dlock

go 1.26.0

require (
	github.com/dlock-go/dlock v0.0.0
	github.com/redis/go-redis/v9 v9.22.0
	github.com/spf13/cobra v1.10.2
	golang.org/x/sys v0.49.0
	golang.org/x/term v0.47.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	go.uber.org/atomic v1.12.0 // indirect
)

replace github.com/dlock-go/dlock => ../..
