//! The `calico-ipam` personality: this executable answering as Calico's
//! IPAM plugin. It opens the datastore the config names and runs the
//! verbs of [`super::calico::verbs`].

use crate::cni::{CniResult, Command, Request, Result};
use crate::datastore::open::open;
use crate::k8s::K8sClient;

use super::calico::verbs::{self, Call, KubeAccess};

/// Answers one calico-ipam verb.
pub async fn handle(req: Request) -> Result<Option<CniResult>> {
    let host = verbs::node_name(&req);
    let prefix = req
        .env
        .vars
        .get("FELIX_INTERFACEPREFIX")
        .filter(|p| !p.is_empty())
        .cloned();
    let made = std::sync::OnceLock::new();
    let opened = open(&req.conf, &req.env.vars, req.deadline, prefix, || async {
        let client = K8sClient::new(&req.conf.k8s_config(), req.deadline).await?;
        let _ = made.set(client.clone());
        Ok(client)
    })
    .await?;
    let call = Call {
        store: opened.store,
        namespaces: opened.namespaces,
        host,
        namespace_labels: None,
        deadline: req.deadline,
        kube: req
            .env
            .args
            .k8s_pod()
            .map(|_| KubeAccess::new(req.conf.k8s_config(), made.get().cloned())),
    };
    match req.env.command {
        Command::Add => verbs::add(&call, &req).await.map(Some),
        Command::Del => verbs::del(&call, &req).await.map(|()| None),
        Command::Check => verbs::check(&call, &req).await.map(|()| None),
        Command::Status => verbs::status(&call, &req).await.map(|()| None),
        Command::Gc => verbs::gc(&call, &req).await.map(|()| None),
        Command::Version => unreachable!("answered at the edge"),
    }
}
