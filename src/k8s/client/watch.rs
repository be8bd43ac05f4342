//! Following one object: a list of the objects of that name (one request:
//! the object or its absence, and the collection's resourceVersion), then
//! a watch from there that the server ends after the time asked
//! (`timeoutSeconds`) and that is taken up again from the last
//! resourceVersion seen (bookmarks included), so that a quiet object costs
//! one request per watch.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::core::WatchEvent;
use serde_json::Value;

use super::requests::query_escape;
use super::{K8sClient, K8sError};

/// What a watch of one object says.
#[derive(Debug, Clone, PartialEq)]
pub enum Watched {
    /// The object as it now is (added or modified).
    Present(Value),
    /// The object was deleted.
    Deleted,
    /// Nothing about the object: where the watch has got to.
    Progress(String),
    /// The resourceVersion is too old to watch from (410 Gone): list again.
    Expired,
}

impl Watched {
    /// The resourceVersion the watch has reached with this event, if it
    /// tells one.
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            Watched::Present(object) => object
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str),
            Watched::Progress(rv) => Some(rv),
            Watched::Deleted | Watched::Expired => None,
        }
    }
}

impl K8sClient {
    /// The object `name` of the collection at `path` (`None`: there is
    /// none) and the collection's resourceVersion, to watch from.
    pub async fn list_named(
        &self,
        what: &str,
        path: &str,
        name: &str,
    ) -> Result<(Option<Value>, String), K8sError> {
        let page = format!("{path}?fieldSelector={}", field_selector(name));
        let list: Value = self
            .call(what, Self::request(http::Method::GET, &page, None, None))
            .await?
            .ok_or_else(|| K8sError::NotServed(what.to_string()))?;
        let rv = list
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let object = list
            .get("items")
            .and_then(Value::as_array)
            .and_then(|items| items.first())
            .cloned();
        Ok((object, rv))
    }

    /// A watch of the object `name` of the collection at `path`, from
    /// `resource_version`, which the server ends after `timeout` (its
    /// bookmarks asked for). Not bounded by the client's deadline: it
    /// lasts as long as the server keeps it. A 410 Gone, as an answer or
    /// an event, is [`Watched::Expired`].
    pub async fn watch_named(
        &self,
        what: &str,
        path: &str,
        name: &str,
        resource_version: &str,
        timeout: Duration,
    ) -> Result<impl Stream<Item = Result<Watched, K8sError>> + use<>, K8sError> {
        let query = format!(
            "{path}?watch=true&allowWatchBookmarks=true&fieldSelector={}&resourceVersion={}&timeoutSeconds={}",
            field_selector(name),
            query_escape(resource_version),
            timeout.as_secs().max(1)
        );
        let request = Self::request(http::Method::GET, &query, None, None);
        let this = self.clone();
        let what = what.to_string();
        let events = match self.client.request_events::<Value>(request).await {
            Ok(events) => events,
            Err(kube::Error::Api(status)) if status.code == 410 => {
                return Ok(futures::stream::iter([Ok(Watched::Expired)]).boxed());
            }
            Err(e) => return Err(self.map_err(&what, e)),
        };
        Ok(events
            .map(move |event| match event {
                Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => {
                    Ok(Watched::Present(object))
                }
                Ok(WatchEvent::Deleted(_)) => Ok(Watched::Deleted),
                Ok(WatchEvent::Bookmark(mark)) => {
                    Ok(Watched::Progress(mark.metadata.resource_version))
                }
                Ok(WatchEvent::Error(status)) if status.code == 410 => Ok(Watched::Expired),
                Ok(WatchEvent::Error(status)) => Err(this.map_err(&what, kube::Error::Api(status))),
                Err(e) => Err(this.map_err(&what, e)),
            })
            .boxed())
    }
}

/// `metadata.name=<name>`, escaped for a query.
fn field_selector(name: &str) -> String {
    query_escape(&format!("metadata.name={name}"))
}
