# The test bed's node (sourced by scripts/testbed.sh: `up --node`, `down`):
# a real kubelet and kube-scheduler (built by scripts/peers.sh from
# k8s.io/kubernetes like the control plane), the node's own containerd with
# Debian's runc, and this plugin installed by `calico install` exactly as
# Calico's install-cni init container runs it (its image's /opt/cni/bin,
# Calico's stock Kubernetes conflist text, a CNI kubeconfig minted with
# TokenRequest by a calico-node ServiceAccount), plus an IPPool for the node.
#
# The conflist template is Calico's stock Kubernetes text (written from its
# field list) with one change: cniVersion 1.1.0 instead of 0.3.1, since libcni
# (containerd) calls STATUS only for 1.1.0 configs and the node's readiness
# is to follow our STATUS.
#
# Under $TESTBED_DIR/node:
#   image/        what Calico's CNI image holds in /opt/cni/bin: calico
#                 (CALICO_BIN, default the debug build), calico-ipam and
#                 install as links, portmap and loopback
#   host/         the host as install sees it (--host-root): opt/cni/bin and
#                 etc/cni/net.d, where containerd reads them
#   sa/           the calico-node ServiceAccount's token, CA and namespace
#                 (what a pod has in /var/run/secrets/kubernetes.io/serviceaccount)
#   containerd/, kubelet/, pod-logs/, volume-plugins/, pki/, sysctl.orig
#
# The Node becomes Ready only when containerd's CNI STATUS call (our STATUS)
# says the network is ready: node_up creates the IPPool only after the Node
# has registered NotReady for want of it, and waits for Ready. No
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
kubelet_port=${TESTBED_KUBELET_PORT:-26450}
kubelet_healthz_port=${TESTBED_KUBELET_HEALTHZ_PORT:-26448}
scheduler_port=${TESTBED_SCHEDULER_PORT:-26459}
node_dir=$dir/node

# fill TEMPLATE OUT: the @NAME@ placeholders of the node's templates.
fill() {
  sed -e "s#@NODE@#$node_dir#g" -e "s#@CA@#$dir/pki/ca.crt#g" \
    -e "s#@KUBELET_PORT@#$kubelet_port#g" -e "s#@HEALTHZ_PORT@#$kubelet_healthz_port#g" \
    -e "s#@CNI_BIN@#$node_dir/host/opt/cni/bin#g" -e "s#@CNI_CONF@#$node_dir/host/etc/cni/net.d#g" \
    -e "s#@PAUSE@#$pause_image#g" "$1" >"$2"
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

# The CNI install as Calico's DaemonSet runs it: a calico-node identity
# allowed to mint calico-cni-plugin's token, the image's binaries, the
# stock template.
node_install() {
  local image=$node_dir/image calico=${CALICO_BIN:-$root/target/x86_64-unknown-linux-gnu/debug/calico}
  [ -x "$calico" ] || die "no plugin binary at $calico (build it, or set CALICO_BIN)"
  rm -rf "$image"
  mkdir -p "$image" "$node_dir/host/opt/cni/bin" "$node_dir/host/etc/cni/net.d" "$node_dir/sa"
  cp "$calico" "$image/calico"
  ln -s calico "$image/calico-ipam"
  ln -s calico "$image/install"
  cp "$bin/portmap" "$bin/loopback" "$image/"
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
  admin POST /api/v1/namespaces/kube-system/serviceaccounts/calico-node/token \
    --data-binary '{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":86400}}' \
    | jq -er .status.token >"$node_dir/sa/token" || die "TokenRequest for calico-node failed"
  cp "$dir/pki/ca.crt" "$node_dir/sa/ca.crt"
  echo -n kube-system >"$node_dir/sa/namespace"
  env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT="$api_port" \
    KUBERNETES_NODE_NAME="$node_name" CNI_NET_DIR="$node_dir/host/etc/cni/net.d" \
    CNI_CONF_NAME=10-calico.conflist CNI_MTU=1500 SLEEP=false \
    CNI_NETWORK_CONFIG="$(cat testbed/node/cni_network_config.json)" \
    "$image/install" --host-root "$node_dir/host" --binaries "$image" \
    --serviceaccount-dir "$node_dir/sa" >"$dir/logs/node-install.log" 2>&1 \
    || die "calico install failed: $(tail -n 5 "$dir/logs/node-install.log")"
}

node_start_kubelet() {
  start kubelet "$bin/kubelet" --config="$node_dir/kubelet-config.yaml" \
    --kubeconfig="$node_dir/kubelet.kubeconfig" --hostname-override="$node_name" \
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

  # Identities: the kubelet as system:node:<name> (the test bed has no Node
  # authorizer: RBAC binds it), the scheduler as system:kube-scheduler.
  cert node-kubelet "/O=system:nodes/CN=system:node:$node_name"
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

  node_install
  fill testbed/node/containerd.toml "$node_dir/containerd.toml"
  fill testbed/node/kubelet-config.yaml "$node_dir/kubelet-config.yaml"
  # (PATH: its shim, in $bin, and runc.)
  (
    export PATH="$bin:/usr/sbin:/usr/bin:/sbin:/bin" TMPDIR="$node_dir/containerd"
    start node-containerd "$bin/containerd" --config "$node_dir/containerd.toml"
  )
  wait_for node-containerd 60 node_crictl info
  # The sandbox image and the tests' workload image (peers/echo/echo.c),
  # imported: no registry here.
  oci_image "$node_dir/echo-image.tar" "$echo_image" "$bin/echo" '["/echo","serve"]'
  local tar
  for tar in "$dir/pause-image.tar" "$node_dir/echo-image.tar"; do
    "$bin/ctr" -a "$node_dir/containerd/containerd.sock" -n k8s.io images import "$tar" \
      >>"$dir/logs/node-images.log" 2>&1 || die "importing $tar: $(tail -n 3 "$dir/logs/node-images.log")"
  done

  local kc=$node_dir/scheduler.kubeconfig
  start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$kc" --authentication-kubeconfig="$kc" \
    --authorization-kubeconfig="$kc" --bind-address=127.0.0.1 --secure-port="$scheduler_port" \
    --leader-elect=false --v=1
  node_start_kubelet
  wait_for "Node $node_name" 60 admin GET "/api/v1/nodes/$node_name"
  # No pool for it yet: our STATUS answers 50 and the node stays NotReady
  # (what kubelet said is kept for tests/node.rs).
  sleep 5
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
  log "node $node_name Ready in $((SECONDS - t0)) s"
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
  # Pods first, through kubelet and the plugin (their CNI DELs).
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
  local o
  for o in clusterrolebindings/testbed-node-kubelet clusterrolebindings/calico-node-cni-token clusterroles/calico-node-cni-token; do
    admin DELETE "/apis/rbac.authorization.k8s.io/v1/$o" >/dev/null 2>&1 || true
  done
  admin DELETE /api/v1/namespaces/kube-system/serviceaccounts/calico-node >/dev/null 2>&1 || true
  if [ -f "$node_dir/sysctl.orig" ]; then
    local v
    mapfile -t v <"$node_dir/sysctl.orig"
    sysctl -q -w vm.overcommit_memory="${v[0]}" kernel.panic="${v[1]}" kernel.panic_on_oops="${v[2]}" || true
  fi
  [ -f "$node_dir/made-var-lib-kubelet" ] && rm -rf /var/lib/kubelet
  [ -f "$node_dir/made-var-log-containers" ] && rm -rf /var/log/containers
  rm -rf "$node_dir"
  log "node down"
}
