#!/usr/bin/env bash
# The test bed: a real control plane on loopback, for the tests and by hand.
#
#   scripts/testbed.sh up     start (idempotent: a running, healthy bed is kept)
#   scripts/testbed.sh up --node   and the node: kubelet, kube-scheduler, its
#                             containerd, this plugin installed by `calico install`
#                             (scripts/testbed-node.sh)
#   scripts/testbed.sh restart-kubelet   the node's kubelet stopped and started again
#   scripts/testbed.sh restart-apiserver   kube-apiserver stopped and started again
#   scripts/testbed.sh restart-calico-etcd-leader   the calico-etcd leader killed,
#                             down 2 s (TESTBED_DOWN_SECONDS), started again
#   scripts/testbed.sh node-down   the node only
#   scripts/testbed.sh node-import-e2e-images   the e2e suite's images (agnhost, the
#                             glibc DNS image, an nginx stand-in) into the node's
#                             containerd (agnhost built by scripts/peers.sh --e2e;
#                             scripts/node-e2e.sh does it)
#   scripts/testbed.sh env    shell exports for the tests (eval "$(scripts/testbed.sh env)")
#   scripts/testbed.sh down   stop everything and remove what `up` made
#
# What `up` makes, under $TESTBED_DIR (default /run/calico-cni-testbed):
# - a CA and certificates (etcd, kube-apiserver, admin in system:masters,
#   kube-controller-manager, a certificate for the tests' fault proxy, Calico's
#   etcd and its client calico-cni) and
#   the service-account signing key pair;
# - etcd (TLS, client certificates) and kube-apiserver (TLS, RBAC, the
#   service-account issuer) on 127.0.0.1, and kube-controller-manager (the
#   garbage collector; node IPAM with --allocate-node-cidrs, so a Node created
#   through the API gets real spec.podCIDRs, a /24 of 10.250.0.0/16 and a /64
#   of fd00:10:250::/56);
# - a second etcd, for Calico's own data (the etcd datastore): three members
#   calico-etcd-0..2 on 127.0.0.1, TLS with client certificates on the client
#   and the peer URLs, and a client certificate calico-cni for the plugin;
# - Calico's CRDs (testbed/crds.json: group crd.projectcalico.org, v1,
#   cluster-scoped; testbed/crds-v3.json: the same as Calico v3.32's native
#   projectcalico.org/v3 CRDs; testbed/crds-kubevirt.json: KubeVirt's
#   VirtualMachineInstance and VirtualMachine, what Calico reads of a VM), the calico-cni-plugin ServiceAccount bound to the
#   calico-cni ClusterRole (testbed/rbac.json: the permissions Calico's
#   calico-cni role grants), a CNI kubeconfig holding a token minted for it
#   with the TokenRequest API, ClusterInformation `default` with
#   datastoreReady true, IPAMConfig and KubeControllersConfiguration
#   `default` (as calico-node and calico-kube-controllers make them), an
#   admin kubeconfig;
# - the sandbox image for containerd: the static pause binary packed as an
#   OCI image layout tar (pause-image.tar, name $PAUSE_IMAGE).
# Peers come from scripts/peers.sh (built first, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=${TESTBED_DIR:-/run/calico-cni-testbed}
etcd_port=${TESTBED_ETCD_PORT:-23791}
etcd_peer_port=${TESTBED_ETCD_PEER_PORT:-23801}
# Calico's etcd: member i listens on client port base+i, peer port base+i.
calico_etcd_members=3
calico_etcd_port=${TESTBED_CALICO_ETCD_PORT:-23821}
calico_etcd_peer_port=${TESTBED_CALICO_ETCD_PEER_PORT:-23831}
api_port=${TESTBED_API_PORT:-26443}
kcm_port=${TESTBED_KCM_PORT:-26444}
api=https://127.0.0.1:$api_port
cluster_cidr=10.250.0.0/16,fd00:10:250::/56
service_cidr=10.251.0.0/24,fd00:10:251::/112
pause_image=calico-cni.test/pause:1
token_seconds=86400

log() { echo "testbed: $*" >&2; }
die() {
  log "$*"
  for f in "$dir"/logs/*.log; do
    [ -f "$f" ] && { echo "--- tail of $f" >&2; tail -n 20 "$f" >&2; }
  done
  exit 1
}

# alive NAME: the process of NAME.pid runs, and is that peer (not a process
# that got its pid after a reboot or a kill): its executable is NAME.exe (what
# `start` ran), or $bin/NAME.
alive() {
  local pid exe
  pid=$(cat "$dir/$1.pid" 2>/dev/null) || return 1
  exe=$(cat "$dir/$1.exe" 2>/dev/null) || exe=$(readlink -f "$bin/$1")
  # (" (deleted)": the peer's binary was rebuilt while it ran; still ours.)
  local running
  running=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "${running% (deleted)}" = "$exe" ]
}

# start NAME COMMAND...: runs COMMAND in its own session, logs to logs/NAME.log.
# NAME is unique; the executable need not be called NAME. Without the ETCD_*
# variables of `env` (the plugin's): etcd takes them for its flags, and dies
# on one that a flag also sets.
start() {
  local name=$1
  shift
  alive "$name" && return 0
  readlink -f "$1" >"$dir/$name.exe"
  (
    for v in $(compgen -e | grep '^ETCD_'); do unset "$v"; done
    exec setsid "$@" </dev/null >"$dir/logs/$name.log" 2>&1
  ) &
  echo $! >"$dir/$name.pid"
}

# stop NAME: TERM, then KILL after 10 s.
stop() {
  local name=$1 pid
  [ -f "$dir/$name.pid" ] || return 0
  pid=$(cat "$dir/$name.pid")
  if alive "$name"; then
    kill -TERM "$pid" 2>/dev/null || true
    # alive, not kill -0: an exited peer stays a zombie until init reaps it.
    for _ in $(seq 100); do alive "$name" || break; sleep 0.1; done
    alive "$name" && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/$name.pid" "$dir/$name.exe"
}

# step WHAT: the phase of `up` that starts now, said with the seconds since
# `up` started; the one before it said done, with how long it took.
step_t0=$SECONDS
step_name=
step_start=$SECONDS
step() {
  [ -n "$step_name" ] && log "$step_name: done in $((SECONDS - step_start)) s"
  step_name=$1
  step_start=$SECONDS
  [ -n "$step_name" ] && log "[$((SECONDS - step_t0)) s] $step_name..."
  return 0
}

# wait_for WHAT SECONDS COMMAND...: COMMAND every 0.2 s until it succeeds;
# every 5 s of waiting says so with the attempts so far, and a wait of more
# than one attempt says how many it took.
wait_for() {
  local what=$1 secs=$2
  shift 2
  local start=$SECONDS attempts=0
  local end=$((start + secs)) said=$start
  until attempts=$((attempts + 1)) && "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || die "$what not ready after ${secs}s ($attempts attempts)"
    if [ $((SECONDS - said)) -ge 5 ]; then
      said=$SECONDS
      log "waiting for $what: attempt $attempts, $((SECONDS - start)) s of ${secs} s"
    fi
    sleep 0.2
  done
  [ $attempts -eq 1 ] || log "$what ready after $attempts attempts ($((SECONDS - start)) s)"
}

# The admin's requests, with its client certificate.
admin() {
  local method=$1 path=$2
  shift 2
  curl -sS --fail-with-body --max-time 30 --cacert "$dir/pki/ca.crt" \
    --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" \
    -X "$method" -H 'Content-Type: application/json' "$@" "$api$path"
}

# create PATH JSON: POST, an existing object (409) is fine.
create() {
  local out
  if ! out=$(admin POST "$1" --data-binary "$2" 2>&1); then
    grep -q '"reason": *"AlreadyExists"' <<<"$out" || die "POST $1: $out"
  fi
}

# cert NAME SUBJECT [SAN]: a key and a certificate signed by the test bed CA.
cert() {
  local name=$1 subj=$2 san=${3:-}
  local p=$dir/pki
  [ -f "$p/$name.crt" ] && return 0
  openssl ecparam -name prime256v1 -genkey -noout -out "$p/$name.key" 2>/dev/null
  openssl req -new -key "$p/$name.key" -subj "$subj" -out "$p/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -n "$san" ] && echo "subjectAltName=$san"
  } >"$p/$name.ext"
  openssl x509 -req -in "$p/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" \
    -CAcreateserial -days 365 -sha256 -extfile "$p/$name.ext" -out "$p/$name.crt" 2>/dev/null
  rm -f "$p/$name.csr" "$p/$name.ext"
}

pki() {
  local p=$dir/pki
  mkdir -p "$p"
  if [ ! -f "$p/ca.crt" ]; then
    openssl ecparam -name prime256v1 -genkey -noout -out "$p/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$p/ca.key" -subj "/CN=calico-cni-testbed-ca" -days 365 \
      -sha256 -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$p/ca.crt" 2>/dev/null
  fi
  local loop="IP:127.0.0.1,DNS:localhost"
  cert etcd "/CN=etcd" "$loop"
  cert etcd-client "/CN=etcd-client"
  cert apiserver "/CN=kube-apiserver" "$loop,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.251.0.1${node_ip:+,IP:$node_ip}"
  cert admin "/O=system:masters/CN=testbed-admin"
  cert kcm "/CN=system:kube-controller-manager"
  cert proxy "/CN=fault-proxy" "$loop"
  cert calico-etcd "/CN=calico-etcd" "$loop"
  cert calico-cni "/CN=calico-cni"
  cert apiserver-kubelet-client "/CN=kube-apiserver-kubelet-client"
  if [ ! -f "$p/sa.key" ]; then
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
  fi
}

# kubeconfig FILE USER-JSON: a kubeconfig for the test bed's API server.
kubeconfig() {
  jq -n --arg server "$api" --arg ca "$(base64 -w0 "$dir/pki/ca.crt")" --argjson user "$2" '{
    apiVersion: "v1", kind: "Config",
    clusters: [{name: "testbed", cluster: {server: $server, "certificate-authority-data": $ca}}],
    users: [{name: "user", user: $user}],
    contexts: [{name: "testbed", context: {cluster: "testbed", user: "user"}}],
    "current-context": "testbed"
  }' >"$1.new"
  mv -f "$1.new" "$1"
}

start_etcd() {
  local p=$dir/pki
  mkdir -p "$dir/etcd"
  start etcd "$bin/etcd" --name testbed --data-dir "$dir/etcd" \
    --listen-client-urls "https://127.0.0.1:$etcd_port" \
    --advertise-client-urls "https://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "testbed=http://127.0.0.1:$etcd_peer_port" \
    --cert-file "$p/etcd.crt" --key-file "$p/etcd.key" \
    --client-cert-auth --trusted-ca-file "$p/ca.crt" \
    --unsafe-no-fsync --log-level warn
  wait_for etcd 30 curl -sf --max-time 2 --cacert "$p/ca.crt" --cert "$p/etcd-client.crt" \
    --key "$p/etcd-client.key" "https://127.0.0.1:$etcd_port/health"
}

# Calico's etcd: three members started together (none is healthy before a
# quorum runs), then each one's /health with the calico-cni certificate.
calico_etcd_endpoints() {
  local i sep=
  for i in $(seq 0 $((calico_etcd_members - 1))); do
    printf '%shttps://127.0.0.1:%s' "$sep" $((calico_etcd_port + i))
    sep=,
  done
}

start_calico_etcd() {
  local p=$dir/pki i cluster= sep=
  for i in $(seq 0 $((calico_etcd_members - 1))); do
    cluster+="${sep}calico-etcd-$i=https://127.0.0.1:$((calico_etcd_peer_port + i))"
    sep=,
  done
  for i in $(seq 0 $((calico_etcd_members - 1))); do
    local client=https://127.0.0.1:$((calico_etcd_port + i))
    local peer=https://127.0.0.1:$((calico_etcd_peer_port + i))
    mkdir -p -m 700 "$dir/calico-etcd-$i"
    # --initial-cluster* only count on a first start (an empty data dir).
    start "calico-etcd-$i" "$bin/etcd" --name "calico-etcd-$i" --data-dir "$dir/calico-etcd-$i" \
      --listen-client-urls "$client" --advertise-client-urls "$client" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --initial-cluster "$cluster" --initial-cluster-token calico-cni-testbed \
      --initial-cluster-state new \
      --cert-file "$p/calico-etcd.crt" --key-file "$p/calico-etcd.key" \
      --client-cert-auth --trusted-ca-file "$p/ca.crt" \
      --peer-cert-file "$p/calico-etcd.crt" --peer-key-file "$p/calico-etcd.key" \
      --peer-client-cert-auth --peer-trusted-ca-file "$p/ca.crt" \
      --unsafe-no-fsync --log-level warn
  done
  for i in $(seq 0 $((calico_etcd_members - 1))); do
    wait_for "calico-etcd-$i" 30 curl -sf --max-time 2 --cacert "$p/ca.crt" \
      --cert "$p/calico-cni.crt" --key "$p/calico-cni.key" \
      "https://127.0.0.1:$((calico_etcd_port + i))/health"
  done
}

# The API server advertises the node's address (the `kubernetes` Service's
# endpoint, which pods reach through kube-proxy: loopback endpoint addresses
# are refused), so it listens on every address; without a default route,
# loopback only.
start_apiserver() {
  local p=$dir/pki api_bind=127.0.0.1 api_advertise=127.0.0.1
  [ -n "$node_ip" ] && { api_bind=0.0.0.0; api_advertise=$node_ip; }
  start kube-apiserver "$bin/kube-apiserver" \
    --bind-address="$api_bind" --advertise-address="$api_advertise" --secure-port="$api_port" \
    --etcd-servers="https://127.0.0.1:$etcd_port" --etcd-cafile="$p/ca.crt" \
    --etcd-certfile="$p/etcd-client.crt" --etcd-keyfile="$p/etcd-client.key" \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
    --client-ca-file="$p/ca.crt" --authorization-mode=RBAC \
    --service-account-issuer="$api" --service-account-key-file="$p/sa.pub" \
    --service-account-signing-key-file="$p/sa.key" \
    --service-cluster-ip-range="$service_cidr" --allow-privileged=true \
    --disable-admission-plugins=ServiceAccount --enable-priority-and-fairness=false \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$p/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --audit-policy-file="$root/testbed/audit-policy.yaml" --audit-log-path="$dir/logs/audit.log" \
    --audit-log-maxsize=200 --audit-log-maxbackup=5 \
    --cert-dir="$dir/apiserver" --v=1
  wait_for kube-apiserver 90 admin GET /readyz
}

# restart-apiserver: kube-apiserver stopped (TERM) and started again; back
# when /readyz answers.
restart_apiserver() {
  alive kube-apiserver || die "kube-apiserver is not running (scripts/testbed.sh up)"
  stop kube-apiserver
  start_apiserver
  log "kube-apiserver restarted"
}

# restart-calico-etcd-leader: the calico-etcd member that leads killed
# (KILL), down for TESTBED_DOWN_SECONDS (default 2), started again; back
# when every member is healthy. Says which member it was.
restart_calico_etcd_leader() {
  local p=$dir/pki i status leader=
  for i in $(seq 0 $((calico_etcd_members - 1))); do
    status=$(curl -sf --max-time 2 --cacert "$p/ca.crt" --cert "$p/calico-cni.crt" \
      --key "$p/calico-cni.key" -X POST -d '{}' \
      "https://127.0.0.1:$((calico_etcd_port + i))/v3/maintenance/status") || continue
    [ "$(jq -r '.header.member_id' <<<"$status")" = "$(jq -r '.leader' <<<"$status")" ] && leader=$i
  done
  [ -n "$leader" ] || die "no calico-etcd member says it leads"
  kill -KILL "$(cat "$dir/calico-etcd-$leader.pid")" 2>/dev/null || true
  stop "calico-etcd-$leader"
  sleep "${TESTBED_DOWN_SECONDS:-2}"
  start_calico_etcd
  log "calico-etcd-$leader (the leader) killed and started again"
}

# No kubelet runs here: the controllers that would act on pods of absent or
# never-ready nodes (podgc deletes pods bound to a missing Node, nodelifecycle
# evicts from NotReady ones, taint-eviction) and the cloud ones stay off.
controllers='*,-pod-garbage-collector-controller,-node-lifecycle-controller,-taint-eviction-controller,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller'

start_controller_manager() {
  local p=$dir/pki
  kubeconfig "$dir/kcm.kubeconfig" \
    "$(jq -n --arg c "$p/kcm.crt" --arg k "$p/kcm.key" '{"client-certificate": $c, "client-key": $k}')"
  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig="$dir/kcm.kubeconfig" --authentication-kubeconfig="$dir/kcm.kubeconfig" \
    --authorization-kubeconfig="$dir/kcm.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$kcm_port" --cert-dir="$dir/kcm" \
    --leader-elect=false --use-service-account-credentials=true \
    --allocate-node-cidrs=true --cluster-cidr="$cluster_cidr" \
    --node-cidr-mask-size-ipv4=24 --node-cidr-mask-size-ipv6=64 \
    --service-cluster-ip-range="$service_cidr" \
    --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --controllers="$controllers" --v=1
  wait_for kube-controller-manager 60 curl -sfk --max-time 2 "https://127.0.0.1:$kcm_port/healthz"
}

crd_established() {
  admin GET "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$1" \
    | jq -e '.status.conditions[]? | select(.type == "Established" and .status == "True")'
}

calico_objects() {
  local crd set
  # Both sets: crd.projectcalico.org/v1 (what the tests use by default) and
  # Calico v3.32's native projectcalico.org/v3 CRDs (calico_api_group).
  for set in testbed/crds.json testbed/crds-v3.json testbed/crds-kubevirt.json; do
    while read -r crd; do
      create /apis/apiextensions.k8s.io/v1/customresourcedefinitions "$crd"
    done < <(jq -c '.[]' "$set")
  done
  for crd in $(jq -r '.[].metadata.name' testbed/crds.json testbed/crds-v3.json testbed/crds-kubevirt.json); do
    wait_for "CRD $crd" 30 crd_established "$crd"
  done
  local obj kind
  jq -c '.[]' testbed/rbac.json | while read -r obj; do
    kind=$(jq -r .kind <<<"$obj")
    case $kind in
      ServiceAccount) create /api/v1/namespaces/kube-system/serviceaccounts "$obj" ;;
      ClusterRole)
        create /apis/rbac.authorization.k8s.io/v1/clusterroles "$obj"
        # An older test bed's role: brought up to date.
        admin PUT "/apis/rbac.authorization.k8s.io/v1/clusterroles/$(jq -r .metadata.name <<<"$obj")" \
          --data-binary "$obj" >/dev/null ;;
      ClusterRoleBinding) create /apis/rbac.authorization.k8s.io/v1/clusterrolebindings "$obj" ;;
      *) die "testbed/rbac.json: unexpected kind $kind" ;;
    esac
  done
  create /apis/crd.projectcalico.org/v1/clusterinformations "$(jq -n --arg guid "$(cat /proc/sys/kernel/random/uuid | tr -d -)" '{
    apiVersion: "crd.projectcalico.org/v1", kind: "ClusterInformation",
    metadata: {name: "default"},
    spec: {clusterGUID: $guid, clusterType: "k8s,bgp,kdd", calicoVersion: "v3.32.1", datastoreReady: true}
  }')"
  # IPAMConfig `default` as Calico v3.32 writes it when it finds none (its
  # calico-ipam creates it, which the calico-cni role does not allow; in a
  # cluster calico-node's start-up has made it before any pod).
  create /apis/crd.projectcalico.org/v1/ipamconfigs '{
    "apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMConfig",
    "metadata": {"name": "default"},
    "spec": {"autoAllocateBlocks": true, "strictAffinity": false, "kubeVirtVMAddressPersistence": "Enabled"}
  }'
  # The same in the v3 group (IPAMConfig is IPAMConfiguration there).
  create /apis/projectcalico.org/v3/clusterinformations "$(admin GET /apis/crd.projectcalico.org/v1/clusterinformations/default \
    | jq -c '{apiVersion: "projectcalico.org/v3", kind: "ClusterInformation", metadata: {name: "default"}, spec: .spec}')"
  create /apis/projectcalico.org/v3/ipamconfigurations '{
    "apiVersion": "projectcalico.org/v3", "kind": "IPAMConfiguration",
    "metadata": {"name": "default"},
    "spec": {"autoAllocateBlocks": true, "strictAffinity": false, "kubeVirtVMAddressPersistence": "Enabled"}
  }'
  # KubeControllersConfiguration `default` as calico-kube-controllers makes
  # it (calicoctl ipam check reads it).
  create /apis/crd.projectcalico.org/v1/kubecontrollersconfigurations '{
    "apiVersion": "crd.projectcalico.org/v1", "kind": "KubeControllersConfiguration",
    "metadata": {"name": "default"},
    "spec": {"healthChecks": "Enabled", "logSeverityScreen": "Info", "etcdV3CompactionPeriod": "10m",
             "controllers": {"node": {"reconcilerPeriod": "5m", "syncLabels": "Enabled", "leakGracePeriod": "15m"},
                             "loadBalancer": {"assignIPs": "AllServices"}}}
  }'
}

# The CNI's kubeconfig: a token minted for calico-cni-plugin (TokenRequest),
# as calico-node writes it. Minted again when missing or older than half its life.
cni_kubeconfig() {
  local kc=$dir/calico-cni.kubeconfig
  if [ -f "$kc" ] && [ $(($(date +%s) - $(stat -c %Y "$kc"))) -lt $((token_seconds / 2)) ]; then
    return 0
  fi
  local token
  token=$(admin POST /api/v1/namespaces/kube-system/serviceaccounts/calico-cni-plugin/token \
    --data-binary "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"TokenRequest\",\"spec\":{\"expirationSeconds\":$token_seconds}}" \
    | jq -er .status.token) || die "TokenRequest for calico-cni-plugin failed"
  kubeconfig "$kc" "$(jq -n --arg t "$token" '{token: $t}')"
  chmod 600 "$kc"
}

# oci_image OUT NAME BINARY ENTRYPOINT-JSON: an OCI image layout tar of one
# static binary at /<its name>, named NAME (what `ctr images import` reads),
# run as 65535.
oci_image() {
  local out=$1 name=$2 binary=$3 entrypoint=$4
  [ -f "$out" ] && return 0
  local r
  r=$(mktemp -d)
  install -m 0755 "$binary" "$r/$(basename "$binary")"
  oci_layout "$out" "$name" "$r" "$entrypoint" null 65535:65535
  rm -rf "$r"
}

# oci_layout OUT NAME ROOTFS ENTRYPOINT-JSON CMD-JSON USER (an OCI image
# layout tar of ROOTFS): the one scripts/image.sh builds the CNI image with.
# shellcheck source=scripts/image.sh
source "$root/scripts/image.sh"

# The sandbox image: the static pause binary.
pause_image() {
  oci_image "$dir/pause-image.tar" "$pause_image" "$bin/pause" '["/pause"]'
}

print_env() {
  local p=$dir/pki
  cat <<EOF
export TESTBED_DIR='$dir'
export PEERS_BIN='$bin'
export KUBECONFIG='$dir/admin.kubeconfig'
export CALICO_CNI_KUBECONFIG='$dir/calico-cni.kubeconfig'
export TESTBED_API='$api'
export TESTBED_CA='$p/ca.crt'
export TESTBED_ADMIN_CERT='$p/admin.crt'
export TESTBED_ADMIN_KEY='$p/admin.key'
export TESTBED_PROXY_CERT='$p/proxy.crt'
export TESTBED_PROXY_KEY='$p/proxy.key'
export TESTBED_SA_KEY='$p/sa.key'
export TESTBED_CLUSTER_CIDR='$cluster_cidr'
export TESTBED_PAUSE_IMAGE='$pause_image'
export TESTBED_PAUSE_TAR='$dir/pause-image.tar'
export ETCD_ENDPOINTS='https://127.0.0.1:$etcd_port'
export ETCD_CA_CERT_FILE='$p/ca.crt'
export ETCD_CERT_FILE='$p/etcd-client.crt'
export ETCD_KEY_FILE='$p/etcd-client.key'
export TESTBED_CALICO_ETCD_ENDPOINTS='$(calico_etcd_endpoints)'
export TESTBED_CALICO_ETCD_CA='$p/ca.crt'
export TESTBED_CALICO_ETCD_CERT='$p/calico-cni.crt'
export TESTBED_CALICO_ETCD_KEY='$p/calico-cni.key'
EOF
  if [ -d "$node_dir" ]; then
    cat <<EOF
export TESTBED_NODE='$node_name'
export TESTBED_NODE_POOL='$node_pool_cidr'
export TESTBED_NODE_DIR='$node_dir'
export TESTBED_ECHO_IMAGE='$echo_image'
export TESTBED_AGNHOST_IMAGE='$agnhost_image'
EOF
  fi
}

up() {
  step_t0=$SECONDS
  step "the peers (scripts/peers.sh: built once, then cached)"
  bash scripts/peers.sh >&2
  mkdir -p "$dir/logs"
  local t0=$SECONDS
  step "the certificates and the admin kubeconfig"
  pki
  kubeconfig "$dir/admin.kubeconfig" "$(jq -n --arg c "$dir/pki/admin.crt" --arg k "$dir/pki/admin.key" \
    '{"client-certificate": $c, "client-key": $k}')"
  step "starting etcd (the API server's)"
  start_etcd
  step "starting Calico's etcd ($calico_etcd_members members)"
  start_calico_etcd
  step "starting kube-apiserver and waiting for /readyz"
  start_apiserver
  step "starting kube-controller-manager"
  start_controller_manager
  step "Calico's CRDs, RBAC and default objects"
  calico_objects
  step "the CNI kubeconfig (a token from the TokenRequest API)"
  cni_kubeconfig
  step "the pause image"
  pause_image
  step ""
  log "up in $((SECONDS - t0)) s: $api (state in $dir)"
}

down() {
  node_down
  stop kube-controller-manager
  stop kube-apiserver
  local i
  for i in $(seq 0 $((calico_etcd_members - 1))); do stop "calico-etcd-$i"; done
  stop etcd
  rm -rf "$dir"
  log "down"
}

# shellcheck source=scripts/testbed-node.sh
. scripts/testbed-node.sh

bin=$(bash scripts/peers.sh --print-bin)
case ${1:-} in
  up)
    case ${2:-} in
      "") up ;;
      --node) up && node_up ;;
      *) echo "usage: $0 up [--node]" >&2; exit 2 ;;
    esac
    ;;
  env) print_env ;;
  down) down ;;
  restart-kubelet) node_restart_kubelet ;;
  restart-apiserver) restart_apiserver ;;
  restart-calico-etcd-leader) restart_calico_etcd_leader ;;
  node-down) node_down ;;
  node-import-e2e-images) node_import_e2e_images ;;
  *) echo "usage: $0 up [--node]|env|down|restart-kubelet|restart-apiserver|restart-calico-etcd-leader|node-down|node-import-e2e-images" >&2; exit 2 ;;
esac
