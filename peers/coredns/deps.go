//go:build tools

// The cluster DNS of the test bed's node (scripts/testbed-node.sh), pinned:
// CoreDNS's own main package, built by scripts/peers.sh.
package peers

import _ "github.com/coredns/coredns"
