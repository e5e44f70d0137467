// Command etcd is etcd's server, built from the go.etcd.io/etcd/server/v3 module pinned in this
// module's go.mod, so the end-to-end suites run on the same etcd everywhere.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
