# The test bed's node (sourced by scripts/testbed.sh: `up --node`, `down`):
# a real kubelet and kube-scheduler (built by scripts/peers.sh from
# k8s.io/kubernetes like the control plane), the node's own containerd with
# Debian's runc, and this plugin installed by `calico install` exactly as
# Calico's manifest runs its install-cni: a calico-node DaemonSet
# (testbed/node/calico-node.json) whose init container runs the CNI image's
# install with Calico's stock Kubernetes conflist text from the
# calico-config ConfigMap and the pod's ServiceAccount token, minting the
# CNI kubeconfig's token with TokenRequest; plus an IPPool for the node.
#
# The conflist template is Calico's stock Kubernetes text (written from its
# field list) with one change: cniVersion 1.1.0 instead of 0.3.1, since libcni
# (containerd) calls STATUS only for 1.1.0 configs and the node's readiness
# is to follow our STATUS.
#
# Under $TESTBED_DIR/node:
#   cni-image.tar  Calico's CNI image as our build fills it (/opt/cni/bin:
#                 calico (CALICO_BIN, default the debug build), calico-ipam
#                 and install as links, portmap and loopback), imported as
#                 calico-cni.test/cni:1, as are the echo and (when built)
#                 agnhost images
#   host/         the host's CNI directories, opt/cni/bin and etc/cni/net.d,
#                 where containerd reads them and the DaemonSet mounts them
#   containerd/, kubelet/, pod-logs/, volume-plugins/, sysctl.orig
#
# kubelet starts with no network config: only host-network pods (the
# DaemonSet's) can run. The Node becomes Ready only when containerd's CNI
# STATUS call (our STATUS) says the network is ready: node_up creates the
# IPPool only after the Node has said NotReady for want of it (our STATUS's
# message), and waits for Ready. No
# node-lifecycle controller runs in the test bed (its fake nodes have no
# kubelet), so node_up removes the not-ready taint kubelet registers with.
# Nothing runs outside $TESTBED_DIR but what kubelet insists on
# (/var/lib/kubelet/device-plugins, /var/log/containers: removed at down,
# when node_up created them) and the plugin's node defaults (/var/lib/calico,
# /var/run/calico, /var/log/calico/cni), which a real node shares between
# every call.

node_name=testbed-node
node_pool=testbed-node-pool
node_pool_cidr=10.252.0.0/16
echo_image=calico-cni.test/echo:1
cni_image=calico-cni.test/cni:1
# The name and tag the e2e suite of the node's Kubernetes release asks for
# (test/utils/image/manifest.go); imported, never pulled.
agnhost_image=registry.k8s.io/e2e-test-images/agnhost:2.63.0
# The rest of the images the e2e suite's network tests run, built here from
# this machine's tools (tagged as the suite asks for them): the DNS tests'
# glibc image (dig, nslookup, getent), a stand-in for its nginx (agnhost's
# HTTP server on port 80: the tests that use it only need the pods to run
# and serve) and the pause image under the name the latency test asks for.
glibc_dns_image=registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0
nginx_image=registry.k8s.io/e2e-test-images/nginx:1.15-4
e2e_pause_image=registry.k8s.io/pause:3.10.2
# calico-node's image: Calico v3.32.1's Felix with the tools it execs
# (iptables-nft, ipset, conntrack, nft) from this machine; CoreDNS's.
node_image=calico-cni.test/node:1
coredns_image=calico-cni.test/coredns:1
# kubelet's clusterDNS: the kube-dns Service's address in the service range.
dns_ip=10.251.0.10
cluster_domain=cluster.local
proxy_healthz_port=${TESTBED_PROXY_HEALTHZ_PORT:-26456}
proxy_metrics_port=${TESTBED_PROXY_METRICS_PORT:-26457}
kubelet_port=${TESTBED_KUBELET_PORT:-26450}
kubelet_healthz_port=${TESTBED_KUBELET_HEALTHZ_PORT:-26448}
scheduler_port=${TESTBED_SCHEDULER_PORT:-26459}
node_dir=$dir/node
# The node's address: the one kubelet would pick itself (the source address
# of the default route), given explicitly. kubelet serves on it, as the API
# server reaches kubelets by their InternalIP (exec and logs, for the e2e
# tests: scripts/node-e2e.sh); the machine's own address, so that traffic
# never leaves the machine.
node_ip=${TESTBED_NODE_IP:-$(ip -4 -j route get 192.0.2.1 2>/dev/null | jq -r '.[0].prefsrc // empty')}

# fill TEMPLATE OUT: the @NAME@ placeholders of the node's templates.
fill() {
  sed -e "s#@NODE@#$node_dir#g" -e "s#@CA@#$dir/pki/ca.crt#g" \
    -e "s#@KUBELET_PORT@#$kubelet_port#g" -e "s#@HEALTHZ_PORT@#$kubelet_healthz_port#g" \
    -e "s#@CNI_BIN@#$node_dir/host/opt/cni/bin#g" -e "s#@CNI_CONF@#$node_dir/host/etc/cni/net.d#g" \
    -e "s#@NODE_IP@#$node_ip#g" -e "s#@PKI@#$dir/pki#g" \
    -e "s#@PAUSE@#$pause_image#g" -e "s#@NODE_NAME@#$node_name#g" -e "s#@POOL_CIDR@#$node_pool_cidr#g" \
    -e "s#@PROXY_HEALTHZ_PORT@#$proxy_healthz_port#g" -e "s#@PROXY_METRICS_PORT@#$proxy_metrics_port#g" \
    -e "s#@DNS_IP@#$dns_ip#g" -e "s#@CLUSTER_DOMAIN@#$cluster_domain#g" \
    -e "s#@NODE_IMAGE@#$node_image#g" -e "s#@COREDNS_IMAGE@#$coredns_image#g" "$1" >"$2"
}

node_crictl() {
  "$bin/crictl" --runtime-endpoint "unix://$node_dir/containerd/containerd.sock" \
    --image-endpoint "unix://$node_dir/containerd/containerd.sock" --timeout 60s "$@"
}

node_condition() { # TYPE: the Node's condition status
  admin GET "/api/v1/nodes/$node_name" | jq -r --arg t "$1" '.status.conditions[]? | select(.type == $t) | .status'
}

node_ready() {
  [ "$(node_condition Ready)" = True ]
}

# Ready False with our STATUS's reason (calico-ipam has no pool).
node_not_ready_for_pool() {
  admin GET "/api/v1/nodes/$node_name" | jq -e '.status.conditions[]? |
    select(.type == "Ready" and .status == "False") | .message | test("IP pool")' >/dev/null
}

# Calico's CNI image as our build fills it, built by scripts/image.sh (the
# image the README's DaemonSet change names): /opt/cni/bin with calico
# (CALICO_BIN, default the debug build), calico-ipam and install as links,
# portmap and loopback; install is the entrypoint.
node_cni_image() {
  local calico=${CALICO_BIN:-$root/target/x86_64-unknown-linux-musl/debug/calico}
  [ -x "$calico" ] || die "no plugin binary at $calico (build it, or set CALICO_BIN)"
  bash "$root/scripts/image.sh" --binary "$calico" --out "$node_dir/cni-image.tar" \
    --name "$cni_image" --add "$bin/portmap" --add "$bin/loopback" \
    >>"$dir/logs/node-images.log" 2>&1 || die "scripts/image.sh: $(tail -n 3 "$dir/logs/node-images.log")"
}

# The CNI install as Calico's manifest runs it: the calico-node DaemonSet
# (testbed/node/calico-node.json) on the host network, whose install-cni
# init container runs the image's install with the calico-config
# ConfigMap's template and the pod's own ServiceAccount token (projected
# explicitly: the test bed's API server runs without the ServiceAccount
# admission plugin), writing into the host's CNI directories; its main
# container (`install --watch`, in place of calico-node) renews the CNI
# token. calico-node's identity may only mint calico-cni-plugin's token;
# the API server's address comes from the kubernetes-services-endpoint
# ConfigMap (no kube-proxy here to route the kubernetes Service).
node_install() {
  create /api/v1/namespaces/kube-system/serviceaccounts \
    '{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"calico-node","namespace":"kube-system"}}'
  create /apis/rbac.authorization.k8s.io/v1/clusterroles '{
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
    "metadata": {"name": "calico-node-cni-token"},
    "rules": [{"apiGroups": [""], "resources": ["serviceaccounts/token"],
               "resourceNames": ["calico-cni-plugin"], "verbs": ["create"]}]}'
  create /apis/rbac.authorization.k8s.io/v1/clusterrolebindings '{
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
    "metadata": {"name": "calico-node-cni-token"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "calico-node-cni-token"},
    "subjects": [{"kind": "ServiceAccount", "name": "calico-node", "namespace": "kube-system"}]}'
  create /api/v1/namespaces/kube-system/configmaps "$(jq -n --rawfile t testbed/node/cni_network_config.json '{
    apiVersion: "v1", kind: "ConfigMap", metadata: {name: "calico-config", namespace: "kube-system"},
    data: {cni_network_config: $t, veth_mtu: "1500"}}')"
  create /api/v1/namespaces/kube-system/configmaps "$(jq -n --arg p "$api_port" '{
    apiVersion: "v1", kind: "ConfigMap", metadata: {name: "kubernetes-services-endpoint", namespace: "kube-system"},
    data: {KUBERNETES_SERVICE_HOST: "127.0.0.1", KUBERNETES_SERVICE_PORT: $p}}')"
  # Felix's permissions (testbed/node/calico-node-rbac.json: what it reads
  # of Kubernetes and of Calico's resources; and, beyond Calico's manifest,
  # the nodes' Leases, whose renewals the install watch takes as the sign
  # that the API server's storage takes writes) and the Tiers calico-node's
  # start-up makes (Felix's policy has them as its frame).
  local obj
  while read -r obj; do
    case $(jq -r .kind <<<"$obj") in
      ClusterRole) create /apis/rbac.authorization.k8s.io/v1/clusterroles "$obj" ;;
      ClusterRoleBinding) create /apis/rbac.authorization.k8s.io/v1/clusterrolebindings "$obj" ;;
    esac
  done < <(jq -c '.[]' testbed/node/calico-node-rbac.json)
  local tier
  for tier in "default 1000000 Deny" "kube-admin 1000 Pass" "kube-baseline 10000000 Pass"; do
    set -- $tier
    create /apis/crd.projectcalico.org/v1/tiers "$(jq -n --arg n "$1" --argjson o "$2" --arg a "$3" '{
      apiVersion: "crd.projectcalico.org/v1", kind: "Tier", metadata: {name: $n},
      spec: {order: $o, defaultAction: $a}}')"
  done
  local manifest
  manifest=$(sed -e "s#@CNI_IMAGE@#$cni_image#g" -e "s#@CNI_BIN@#$node_dir/host/opt/cni/bin#g" \
    -e "s#@CNI_CONF@#$node_dir/host/etc/cni/net.d#g" -e "s#@NODE_IMAGE@#$node_image#g" testbed/node/calico-node.json)
  create /apis/apps/v1/namespaces/kube-system/daemonsets "$manifest"
}

# The DaemonSet's pod on this node: its init container's install done.
node_installed() {
  admin GET "/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dcalico-node" |
    jq -e --arg n "$node_name" '.items[] | select(.spec.nodeName == $n) |
      .status.initContainerStatuses[]? | select(.name == "install-cni") |
      .state.terminated.exitCode == 0' >/dev/null &&
    [ -f "$node_dir/host/etc/cni/net.d/10-calico.conflist" ]
}

node_start_kubelet() {
  start kubelet "$bin/kubelet" --config="$node_dir/kubelet-config.yaml" \
    --kubeconfig="$node_dir/kubelet.kubeconfig" --hostname-override="$node_name" --node-ip="$node_ip" \
    --root-dir="$node_dir/kubelet" --cert-dir="$node_dir/kubelet/pki" --v=1
}

# kubelet stopped (TERM) and started again, as a node's service manager
# restarts it; tests/node.rs does it in the middle of pod churn.
node_restart_kubelet() {
  [ -d "$node_dir" ] || die "no node (scripts/testbed.sh up --node)"
  stop kubelet
  node_start_kubelet
  wait_for "kubelet healthz" 60 curl -sf --max-time 2 "http://127.0.0.1:$kubelet_healthz_port/healthz"
}

node_up() {
  [ -x "$bin/kubelet" ] && [ -x "$bin/kube-scheduler" ] || die "kubelet/kube-scheduler not built (scripts/peers.sh)"
  [ -x /usr/sbin/runc ] || die "runc is not installed (Debian package runc)"
  mkdir -p "$node_dir"/{pki,containerd,kubelet,pod-logs,volume-plugins}
  local t0=$SECONDS
  [ -d /var/lib/kubelet ] || touch "$node_dir/made-var-lib-kubelet"
  [ -d /var/log/containers ] || touch "$node_dir/made-var-log-containers"
  [ -f "$node_dir/sysctl.orig" ] ||
    sysctl -n vm.overcommit_memory kernel.panic kernel.panic_on_oops >"$node_dir/sysctl.orig"
  node_host_net_save

  # Identities: the kubelet as system:node:<name> (the test bed has no Node
  # authorizer: RBAC binds it), the scheduler as system:kube-scheduler.
  [ -n "$node_ip" ] || die "no IPv4 default route to take the node's address from (set TESTBED_NODE_IP)"
  cert node-kubelet "/O=system:nodes/CN=system:node:$node_name"
  # kubelet's serving certificate (the API server checks it against the CA).
  rm -f "$dir/pki/node-kubelet-serving".*
  cert node-kubelet-serving "/CN=$node_name" "IP:$node_ip,DNS:$node_name"
  cert node-scheduler "/CN=system:kube-scheduler"
  kubeconfig "$node_dir/kubelet.kubeconfig" "$(jq -n --arg c "$dir/pki/node-kubelet.crt" \
    --arg k "$dir/pki/node-kubelet.key" '{"client-certificate": $c, "client-key": $k}')"
  kubeconfig "$node_dir/scheduler.kubeconfig" "$(jq -n --arg c "$dir/pki/node-scheduler.crt" \
    --arg k "$dir/pki/node-scheduler.key" '{"client-certificate": $c, "client-key": $k}')"
  create /apis/rbac.authorization.k8s.io/v1/clusterrolebindings "$(jq -n --arg u "system:node:$node_name" '{
    apiVersion: "rbac.authorization.k8s.io/v1", kind: "ClusterRoleBinding",
    metadata: {name: "testbed-node-kubelet"},
    roleRef: {apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: "system:node"},
    subjects: [{apiGroup: "rbac.authorization.k8s.io", kind: "User", name: $u}]}')"

  mkdir -p "$node_dir/host/opt/cni/bin" "$node_dir/host/etc/cni/net.d"
  fill testbed/node/containerd.toml "$node_dir/containerd.toml"
  fill testbed/node/kubelet-config.yaml "$node_dir/kubelet-config.yaml"
  # (PATH: its shim, in $bin, and runc.)
  (
    export PATH="$bin:/usr/sbin:/usr/bin:/sbin:/bin" TMPDIR="$node_dir/containerd"
    start node-containerd "$bin/containerd" --config "$node_dir/containerd.toml"
  )
  wait_for node-containerd 60 node_crictl info
  # The sandbox image, the CNI image and the tests' workload image
  # (peers/echo/echo.c), imported: no registry here.
  oci_image "$node_dir/echo-image.tar" "$echo_image" "$bin/echo" '["/echo","serve"]'
  node_cni_image
  node_felix_image
  local tar
  for tar in "$dir/pause-image.tar" "$node_dir/cni-image.tar" "$node_dir/echo-image.tar" "$node_dir/node-image.tar"; do
    node_image_import "$tar"
  done

  local kc=$node_dir/scheduler.kubeconfig
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$kc" --authentication-kubeconfig="$kc" \
    --authorization-kubeconfig="$kc" --bind-address=127.0.0.1 --secure-port="$scheduler_port" \
    --leader-elect=false --v=1
  node_start_kubelet
  wait_for "Node $node_name" 60 admin GET "/api/v1/nodes/$node_name"
  node_start_proxy
  node_install
  wait_for "the CNI install by the calico-node DaemonSet" 90 node_installed
  # No pool for it yet: our STATUS answers 50 and the node stays NotReady
  # (what kubelet said is kept for tests/node.rs).
  wait_for "Node $node_name NotReady for want of a pool" 60 node_not_ready_for_pool
  admin GET "/api/v1/nodes/$node_name" | jq '[.status.conditions[]? | select(.type == "Ready")][0]' \
    >"$node_dir/ready-before-pool.json"
  create /apis/crd.projectcalico.org/v1/ippools "$(jq -n --arg n "$node_pool" --arg c "$node_pool_cidr" \
    --arg node "$node_name" '{
    apiVersion: "crd.projectcalico.org/v1", kind: "IPPool", metadata: {name: $n},
    spec: {cidr: $c, blockSize: 26, ipipMode: "Never", vxlanMode: "Never", natOutgoing: false,
           nodeSelector: ("kubernetes.io/hostname == \u0027" + $node + "\u0027")}}')"
  wait_for "Node $node_name Ready" 90 node_ready
  curl -sS --fail-with-body --max-time 30 --cacert "$dir/pki/ca.crt" \
    --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" -X PATCH \
    -H 'Content-Type: application/merge-patch+json' --data-binary '{"spec":{"taints":null}}' \
    "$api/api/v1/nodes/$node_name" >/dev/null
  wait_for "Felix ready (the calico-node pod)" 120 node_felix_ready
  node_dns
  log "node $node_name Ready in $((SECONDS - t0)) s (Felix, kube-proxy and CoreDNS running)"
}

# rootfs_tools ROOT TOOL...: a root filesystem of this machine's TOOLs
# (names on PATH, or paths) in /usr/bin, with the shared libraries they load
# (and EXTRA_LIBS, more to copy with theirs), /bin, /sbin and /lib as links
# into /usr, and /tmp.
rootfs_tools() {
  local r=$1 tool path lib
  shift
  mkdir -p "$r/usr/bin" "$r/usr/lib/x86_64-linux-gnu" "$r/usr/lib64" "$r/etc" "$r/tmp"
  chmod 1777 "$r/tmp"
  ln -sfn usr/bin "$r/bin"
  ln -sfn usr/bin "$r/sbin"
  ln -sfn usr/lib "$r/lib"
  ln -sfn usr/lib64 "$r/lib64"
  for tool in "$@" ${EXTRA_LIBS:-}; do
    if [ -f "$tool" ]; then path=$tool; else
      path=$(type -P "$tool") || die "$tool is not installed (an image of the node needs it)"
    fi
    case $path in
      *.so*) cp -L "$path" "$r/usr/lib/x86_64-linux-gnu/" ;;
      *) cp -L "$path" "$r/usr/bin/$(basename "$tool")" ;;
    esac
    for lib in $(ldd "$path" 2>/dev/null | grep -o '/[^ ]*'); do
      case $lib in
        */ld-linux*) cp -L "$lib" "$r/usr/lib64/$(basename "$lib")" ;;
        *) cp -L "$lib" "$r/usr/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
      esac
    done
  done
  # (Protocol and service names: ipset and iptables parse "tcp:80" with them.)
  cp /etc/protocols /etc/services "$r/etc/"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$r/etc/group"
}

# node_image_import TAR: into the node's containerd.
node_image_import() {
  "$bin/ctr" -a "$node_dir/containerd/containerd.sock" -n k8s.io images import "$1" \
    >>"$dir/logs/node-images.log" 2>&1 || die "importing $1: $(tail -n 3 "$dir/logs/node-images.log")"
}

# calico-node's image: Calico's Felix (scripts/peers.sh unpacks it from
# CALICO_RELEASE_DIR) and what it execs in iptables mode: the nft flavour of
# iptables (xtables-nft-multi under each name Felix and kube-proxy call, with
# its extensions), ipset, conntrack and nft (Debian's packages).
node_felix_image() {
  local felix=$bin/calico-v3.32.1/calico-felix tar=$node_dir/node-image.tar
  [ -x "$felix" ] || die "no Calico Felix at $felix (scripts/peers.sh unpacks it from CALICO_RELEASE_DIR's calico-felix.xz)"
  [ -f "$tar" ] && return 0
  local r name ext
  r=$(mktemp -d)
  EXTRA_LIBS="$(ls /usr/lib/x86_64-linux-gnu/xtables/*.so)" rootfs_tools "$r" xtables-nft-multi ipset conntrack nft sh
  mkdir -p "$r/usr/lib/x86_64-linux-gnu/xtables"
  for ext in /usr/lib/x86_64-linux-gnu/xtables/*.so; do
    mv "$r/usr/lib/x86_64-linux-gnu/$(basename "$ext")" "$r/usr/lib/x86_64-linux-gnu/xtables/"
  done
  for name in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore \
    iptables-nft iptables-nft-save iptables-nft-restore ip6tables-nft ip6tables-nft-save ip6tables-nft-restore; do
    ln -s xtables-nft-multi "$r/usr/bin/$name"
  done
  install -m 0755 "$felix" "$r/usr/bin/calico-felix"
  mkdir -p "$r/var/run/calico" "$r/var/lib/calico"
  oci_layout "$tar" "$node_image" "$r" '["/usr/bin/calico-felix"]' null 0:0
  rm -rf "$r"
}

# The e2e suite's images (agnhost as its Dockerfile lays it out: /agnhost,
# entrypoint /agnhost, command pause, run as root; the glibc DNS image; the
# nginx stand-in) on one root of this machine's tools instead of Alpine's
# and Debian's: what the network tests exec in them, with their shared
# libraries. Needs agnhost built (scripts/peers.sh --e2e), nc
# (netcat-openbsd) and dig/nslookup (bind9-dnsutils).
node_import_e2e_images() {
  local tar=$node_dir/agnhost-image.tar
  if [ ! -f "$tar" ]; then
    local r
    r=$(mktemp -d)
    rootfs_tools "$r" sh bash curl nc grep cat seq dig nslookup getent hostname timeout sed awk tr cut \
      head tail sort uniq wc sleep date ls mkdir rm touch env ip ping wget printf echo true false id uname ps
    install -m 0755 "$bin/agnhost" "$r/agnhost"
    ln -s agnhost "$r/agnhost-2"
    mkdir -p "$r/uploads" "$r/results"
    # What agnhost's Dockerfile adds besides: porter's TLS test certificate
    # (from the pinned module's source), a CoreDNS at /coredns, the user and
    # group the image defines.
    local kdir
    kdir=$(cd "$root/peers/kubernetes-e2e" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)
    install -m 0644 "$kdir/test/images/agnhost/porter/localhost.crt" "$kdir/test/images/agnhost/porter/localhost.key" "$r/"
    [ -x "$bin/coredns" ] && install -m 0755 "$bin/coredns" "$r/coredns"
    echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >>"$r/etc/passwd"
    printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >>"$r/etc/group"
    oci_layout "$tar" "$agnhost_image" "$r" '["/agnhost"]' '["pause"]' 0:0
    oci_layout "$node_dir/glibc-dns-image.tar" "$glibc_dns_image" "$r" null '["sh"]' 0:0
    oci_layout "$node_dir/nginx-image.tar" "$nginx_image" "$r" '["/agnhost", "netexec", "--http-port=80"]' null 0:0
    rm -rf "$r"
    oci_image "$node_dir/e2e-pause-image.tar" "$e2e_pause_image" "$bin/pause" '["/pause"]'
  fi
  local t
  for t in "$tar" "$node_dir/glibc-dns-image.tar" "$node_dir/nginx-image.tar" "$node_dir/e2e-pause-image.tar"; do
    node_image_import "$t"
  done
}

# What kube-proxy and Felix change on the host, saved before they start and
# put back at `down`: the iptables (nft) rules of both families, the
# sysctls they set. (Their ipsets and conntrack entries are removed.)
node_host_net_save() {
  [ -f "$node_dir/iptables.orig" ] && return 0
  iptables-nft-save >"$node_dir/iptables.orig"
  ip6tables-nft-save >"$node_dir/ip6tables.orig"
  sysctl -n net.ipv4.ip_forward net.ipv4.conf.all.route_localnet net.ipv4.conf.all.rp_filter \
    net.ipv4.conf.default.rp_filter net.ipv6.conf.all.forwarding >"$node_dir/net-sysctl.orig"
  # Felix writes the MTU it detects to /var/lib/calico/mtu, which Calico's
  # plugin then reports in its results: gone again at down unless it was here.
  [ -e /var/lib/calico/mtu ] || touch "$node_dir/mtu-file.felix"
}

node_host_net_restore() {
  [ -f "$node_dir/iptables.orig" ] || return 0
  [ -f "$node_dir/mtu-file.felix" ] && rm -f /var/lib/calico/mtu "$node_dir/mtu-file.felix"
  local t
  for t in filter nat mangle raw security; do
    iptables-nft -t "$t" -F 2>/dev/null || true
    iptables-nft -t "$t" -X 2>/dev/null || true
    ip6tables-nft -t "$t" -F 2>/dev/null || true
    ip6tables-nft -t "$t" -X 2>/dev/null || true
  done
  iptables-nft-restore <"$node_dir/iptables.orig" || log "iptables: the saved rules did not restore"
  ip6tables-nft-restore <"$node_dir/ip6tables.orig" || log "ip6tables: the saved rules did not restore"
  # (kube-proxy's nftables table, when it made one to clean.)
  nft delete table ip kube-proxy 2>/dev/null || true
  nft delete table ip6 kube-proxy 2>/dev/null || true
  local s
  for s in $(ipset list -n 2>/dev/null | grep -E '^(cali|KUBE-)'); do ipset destroy "$s" 2>/dev/null || true; done
  local v
  mapfile -t v <"$node_dir/net-sysctl.orig"
  sysctl -q -w net.ipv4.ip_forward="${v[0]}" net.ipv4.conf.all.route_localnet="${v[1]}" \
    net.ipv4.conf.all.rp_filter="${v[2]}" net.ipv4.conf.default.rp_filter="${v[3]}" \
    net.ipv6.conf.all.forwarding="${v[4]}" || true
  rm -f "$node_dir/iptables.orig"
}

# kube-proxy on the host (a process, as kubeadm's DaemonSet would run it in
# the host's network), as system:kube-proxy (bound to system:node-proxier by
# the API server's default RBAC).
node_start_proxy() {
  [ -x "$bin/kube-proxy" ] || die "kube-proxy not built (scripts/peers.sh)"
  cert node-proxy "/CN=system:kube-proxy"
  kubeconfig "$node_dir/kube-proxy.kubeconfig" "$(jq -n --arg c "$dir/pki/node-proxy.crt" \
    --arg k "$dir/pki/node-proxy.key" '{"client-certificate": $c, "client-key": $k}')"
  fill testbed/node/kube-proxy.yaml "$node_dir/kube-proxy.yaml"
  start kube-proxy "$bin/kube-proxy" --config="$node_dir/kube-proxy.yaml" --v=1
  wait_for kube-proxy 60 curl -sf --max-time 2 "http://127.0.0.1:$proxy_healthz_port/healthz"
}

# The calico-node DaemonSet's pod Ready (Felix's /readiness on :9099).
node_felix_ready() {
  admin GET "/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Dcalico-node" |
    jq -e --arg n "$node_name" '.items[] | select(.spec.nodeName == $n) |
      .status.conditions[]? | select(.type == "Ready") | .status == "True"' >/dev/null
}

# The cluster DNS: CoreDNS (peers/coredns) as kubeadm deploys it, the
# kube-dns Service at kubelet's clusterDNS address (testbed/node/coredns.json).
node_dns() {
  [ -x "$bin/coredns" ] || die "CoreDNS not built (scripts/peers.sh --e2e)"
  oci_image "$node_dir/coredns-image.tar" "$coredns_image" "$bin/coredns" '["/coredns"]'
  node_image_import "$node_dir/coredns-image.tar"
  local obj kind path
  fill testbed/node/coredns.json "$node_dir/coredns.json"
  jq -c '.[]' "$node_dir/coredns.json" | while read -r obj; do
    kind=$(jq -r .kind <<<"$obj")
    case $kind in
      ServiceAccount) path=/api/v1/namespaces/kube-system/serviceaccounts ;;
      ConfigMap) path=/api/v1/namespaces/kube-system/configmaps ;;
      Service) path=/api/v1/namespaces/kube-system/services ;;
      Deployment) path=/apis/apps/v1/namespaces/kube-system/deployments ;;
      ClusterRole) path=/apis/rbac.authorization.k8s.io/v1/clusterroles ;;
      ClusterRoleBinding) path=/apis/rbac.authorization.k8s.io/v1/clusterrolebindings ;;
      *) die "testbed/node/coredns.json: unexpected kind $kind" ;;
    esac
    create "$path" "$obj"
  done
  wait_for "CoreDNS ready" 120 node_dns_ready
}

node_dns_ready() {
  admin GET /apis/apps/v1/namespaces/kube-system/deployments/coredns | jq -e '(.status.readyReplicas // 0) >= 1' >/dev/null
}

# IPAM objects of the node's pool (no calico-kube-controllers collects them).
node_ipam_cleanup() {
  local kind
  for kind in ipamhandles blockaffinities ipamblocks; do
    admin GET "/apis/crd.projectcalico.org/v1/$kind" 2>/dev/null | jq -r --arg n "$node_name" '.items[]? |
      select((.spec.node // "") == $n or ((.spec.cidr // "") | startswith("10.252."))
             or ((.spec.block // {}) | keys | any(startswith("10.252.")))) | .metadata.name' |
      while read -r o; do admin DELETE "/apis/crd.projectcalico.org/v1/$kind/$o" >/dev/null 2>&1 || true; done
  done
}

node_down() {
  [ -d "$node_dir" ] || return 0
  # The DaemonSet first (else it makes its pod again), then the pods,
  # through kubelet and the plugin (their CNI DELs).
  admin DELETE /apis/apps/v1/namespaces/kube-system/daemonsets/calico-node >/dev/null 2>&1 || true
  local o
  for o in deployments/coredns; do
    admin DELETE "/apis/apps/v1/namespaces/kube-system/$o" >/dev/null 2>&1 || true
  done
  for o in services/kube-dns configmaps/coredns serviceaccounts/coredns; do
    admin DELETE "/api/v1/namespaces/kube-system/$o" >/dev/null 2>&1 || true
  done
  local cm
  for cm in calico-config kubernetes-services-endpoint; do
    admin DELETE "/api/v1/namespaces/kube-system/configmaps/$cm" >/dev/null 2>&1 || true
  done
  local ns
  for ns in $(admin GET "/api/v1/pods?fieldSelector=spec.nodeName=$node_name" 2>/dev/null |
    jq -r '.items[]?.metadata.namespace' | sort -u); do
    admin DELETE "/api/v1/namespaces/$ns/pods?fieldSelector=spec.nodeName=$node_name" >/dev/null 2>&1 || true
  done
  local end=$((SECONDS + 60))
  while [ $SECONDS -lt $end ] && alive kubelet &&
    [ "$(admin GET "/api/v1/pods?fieldSelector=spec.nodeName=$node_name" 2>/dev/null | jq '.items | length')" != 0 ]; do
    sleep 0.5
  done
  stop kubelet
  stop kube-scheduler
  stop kube-proxy
  if alive node-containerd; then
    local id
    for id in $(node_crictl pods -q 2>/dev/null); do
      node_crictl stopp "$id" >/dev/null 2>&1 || true
      node_crictl rmp -f "$id" >/dev/null 2>&1 || true
    done
  fi
  stop node-containerd
  pkill -KILL -f "containerd-shim-runc-v2 .*$node_dir/containerd" 2>/dev/null || true
  # Mounts under the node (netns, shm, rootfs, kubelet's rshared root), deepest first.
  awk -v p="$node_dir/" 'index($5, p) == 1 {print $5}' /proc/self/mountinfo |
    awk '{print length, $0}' | sort -rn | cut -d' ' -f2- |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h/kubepods" ] && find "$h/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  admin DELETE "/api/v1/nodes/$node_name" >/dev/null 2>&1 || true
  admin DELETE "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/$node_name" >/dev/null 2>&1 || true
  admin DELETE "/apis/crd.projectcalico.org/v1/ippools/$node_pool" >/dev/null 2>&1 || true
  node_ipam_cleanup
  for o in clusterrolebindings/testbed-node-kubelet clusterrolebindings/calico-node-cni-token clusterroles/calico-node-cni-token \
    clusterrolebindings/calico-node clusterroles/calico-node clusterrolebindings/system:coredns clusterroles/system:coredns; do
    admin DELETE "/apis/rbac.authorization.k8s.io/v1/$o" >/dev/null 2>&1 || true
  done
  admin DELETE /api/v1/namespaces/kube-system/serviceaccounts/calico-node >/dev/null 2>&1 || true
  if [ -f "$node_dir/sysctl.orig" ]; then
    local v
    mapfile -t v <"$node_dir/sysctl.orig"
    sysctl -q -w vm.overcommit_memory="${v[0]}" kernel.panic="${v[1]}" kernel.panic_on_oops="${v[2]}" || true
  fi
  for o in default kube-admin kube-baseline; do
    admin DELETE "/apis/crd.projectcalico.org/v1/tiers/$o" >/dev/null 2>&1 || true
  done
  node_host_net_restore
  [ -f "$node_dir/made-var-lib-kubelet" ] && rm -rf /var/lib/kubelet
  [ -f "$node_dir/made-var-log-containers" ] && rm -rf /var/log/containers
  rm -rf "$node_dir"
  log "node down"
}
