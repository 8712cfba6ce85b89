// Command dlock runs commands under Redis distributed locks and replays the scenarios that
// show why they are needed. It is a thin shell over the github.com/dlock-go/dlock library.
package main

import "os"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }
