//! What an allocation reads besides the blocks: IPAMConfig (read once per
//! call), the pools (read again as of now when a cached list left an
//! assignment without one), the reservations, this host's BlockAffinities;
//! all read ahead of the host lock ([`Allocator::read_ahead`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use ipnet::IpNet;

use super::super::IpamError;
use super::super::pools::pools_select_nodes;
use super::{Allocator, AutoAssign, ds};
use crate::datastore::ListFilter;
use crate::datastore::ipam_model::{
    BlockAffinity, IpPool, IpReservation, IpamConfig, IpamConfigSpec, LABEL_AFFINITY_TYPE,
    LABEL_HOSTNAME_HASH, LABEL_IP_VERSION, hostname_hash,
};

/// What an auto-assignment reads besides the blocks: IPAMConfig, the
/// pools, the reservations and this host's BlockAffinities of each family
/// asked for. Read ahead (before the host lock, all at once: see
/// [`Allocator::read_ahead`]) they keep the lock for the block's reads and
/// writes alone; the affinities may then have changed by the time the lock
/// is held (another ADD of this host claimed a block meanwhile), so they
/// are read again before a block is claimed.
pub struct Inputs {
    pub(super) config: IpamConfigSpec,
    pub(super) pools: Vec<IpPool>,
    pub(super) reserved: Vec<IpNet>,
    /// This host's affinities, IPv4 and IPv6 (`None`: that family is not
    /// asked for).
    pub(super) affinities: [Option<Vec<BlockAffinity>>; 2],
    /// Read before the host lock was held.
    pub(super) ahead: bool,
    /// The host's claims counted before the affinities were read ahead
    /// ([`super::super::block_cache::claims_started`]; `None`: not known).
    pub(super) claims_seen: Option<u64>,
}

impl Inputs {
    /// The inputs, read ahead after this host's claims were counted
    /// `claims_seen`.
    pub fn after_claims(self, claims_seen: Option<u64>) -> Inputs {
        Inputs {
            claims_seen,
            ..self
        }
    }

    /// IPAMConfig as read.
    pub fn config(&self) -> &IpamConfigSpec {
        &self.config
    }
}

/// One family's affinities as an assignment got them.
pub(super) struct Affinities {
    pub(super) list: Vec<BlockAffinity>,
    /// Read before the host lock: read again before a block is claimed
    /// (unless no claim of this host's started since they were read).
    pub(super) ahead: bool,
    pub(super) claims_seen: Option<u64>,
}

impl<'a> Allocator<'a> {
    /// The allocator with IPAMConfig as already read.
    pub fn with_config(self, config: IpamConfigSpec) -> Allocator<'a> {
        self.use_config(config);
        self
    }

    /// [`Allocator::with_config`] on a shared allocator (before its first
    /// read of IPAMConfig: a config already read stays).
    pub fn use_config(&self, config: IpamConfigSpec) {
        let _ = self.config.set(config);
    }

    pub(super) fn affinity_value(&self) -> String {
        format!("host:{}", self.host)
    }

    /// IPAMConfig `default`, or Calico's defaults when absent (read once,
    /// as the datastore's cache holds it: configuration an operator sets,
    /// no write's precondition).
    pub async fn config(&self) -> Result<IpamConfigSpec, IpamError> {
        self.config
            .get_or_try_init(|| async {
                Ok(self
                    .store
                    .get_cached_or_absent::<IpamConfig>("", IpamConfig::NAME)
                    .await
                    .map_err(ds("error getting IPAMConfig"))?
                    .map_or_else(IpamConfigSpec::defaults, |c| c.spec))
            })
            .await
            .cloned()
    }

    /// The `releasedAt` of a release now: `None` (freed at once) without a
    /// cooldown. Sub-second precision, so that a cooldown is never cut
    /// short by the stamp's rounding (Calico's whole seconds read the same).
    pub(super) async fn release_stamp(&self) -> Result<Option<String>, IpamError> {
        let cooldown = self.config().await?.ip_cooldown();
        Ok((!cooldown.is_zero()).then(|| {
            jiff::Timestamp::try_from(SystemTime::now())
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
                .to_string()
        }))
    }

    pub async fn pools(&self) -> Result<Vec<IpPool>, IpamError> {
        if self.latest_pools.load(Ordering::Relaxed) {
            self.store.list_latest::<IpPool>("", &ListFilter::All).await
        } else {
            self.store.list::<IpPool>("", &ListFilter::All).await
        }
        .map_err(ds("error listing IP pools"))
    }

    /// Runs `attempt` again with the pools read as of now when it failed
    /// for want of a pool or an address on a list a cache may have served
    /// (a pool made a moment ago), once.
    pub(super) async fn with_latest_pools<T, F, Fut>(&self, attempt: F) -> Result<T, IpamError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, IpamError>>,
    {
        match attempt().await {
            Err(IpamError::NoPools(_) | IpamError::Exhausted(_) | IpamError::Invalid(_))
                if !self.latest_pools.swap(true, Ordering::Relaxed) =>
            {
                tracing::debug!("no pool or address on the listed pools: reading them as of now");
                attempt().await
            }
            other => other,
        }
    }

    pub(super) async fn reservations(&self) -> Result<Vec<IpNet>, IpamError> {
        let list = self
            .store
            .list::<IpReservation>("", &ListFilter::All)
            .await
            .map_err(ds("error listing IP reservations"))?;
        Ok(list
            .iter()
            .flat_map(|r| r.spec.reserved_cidrs.iter())
            .filter_map(|c| {
                c.parse::<IpNet>()
                    .ok()
                    .or_else(|| c.parse::<IpAddr>().ok().map(IpNet::from))
            })
            .collect())
    }

    /// This host's BlockAffinities of one family (by the labels Calico
    /// looks them up with), live ones only.
    pub(super) async fn host_affinities(&self, v6: bool) -> Result<Vec<BlockAffinity>, IpamError> {
        let labels = BTreeMap::from([
            (LABEL_HOSTNAME_HASH.to_string(), hostname_hash(self.host)),
            (LABEL_AFFINITY_TYPE.to_string(), "host".to_string()),
            (
                LABEL_IP_VERSION.to_string(),
                if v6 { "6" } else { "4" }.to_string(),
            ),
        ]);
        let mut list = self
            .store
            .list::<BlockAffinity>(
                "",
                &ListFilter::Node {
                    node: self.host.to_string(),
                    labels,
                },
            )
            .await
            .map_err(ds("error listing BlockAffinities"))?;
        list.retain(|a| a.spec.node == self.host && a.spec.deleted != "true");
        Ok(list)
    }

    /// Reads an auto-assignment's inputs before the host lock is held.
    pub async fn read_ahead(&self, req: &AutoAssign<'_>) -> Result<Inputs, IpamError> {
        self.inputs(req, true).await
    }

    pub(super) async fn inputs(
        &self,
        req: &AutoAssign<'_>,
        ahead: bool,
    ) -> Result<Inputs, IpamError> {
        let family = async |v6: bool, num: usize| {
            if num == 0 {
                Ok(None)
            } else {
                self.host_affinities(v6).await.map(Some)
            }
        };
        // Read ahead of the lock, the node's labels too when a pool's node
        // selector will need them, as soon as the pools say so (a failure
        // is left for the assignment to meet, and report, when it asks).
        // Where reads made at once cost one request (etcd), the node is
        // read with the pools rather than after them, in case they need
        // it. On the Kubernetes API it is read only when they do (Calico
        // reads it for every assignment): a request per ADD saved where no
        // pool selects nodes, a round trip more before the lock where one
        // does (issue 46: requests per pod at cluster scale).
        let with_pools = self.store.reads_together();
        let pools = async {
            if ahead && with_pools {
                let (pools, _) = tokio::join!(self.pools(), req.labels.node_labels());
                return pools;
            }
            let pools = self.pools().await?;
            if ahead && pools_select_nodes(&pools) {
                let _ = req.labels.node_labels().await;
            }
            Ok(pools)
        };
        let (config, pools, reserved, v4, v6) = futures::future::try_join5(
            self.config(),
            pools,
            self.reservations(),
            family(false, req.num4),
            family(true, req.num6),
        )
        .await?;
        Ok(Inputs {
            config,
            pools,
            reserved,
            affinities: [v4, v6],
            ahead,
            claims_seen: None,
        })
    }
}
