//! Taking messages one at a time: [`Client::get`], settling them with [`Client::settle`],
//! and browsing a queue without taking anything.

use qq_proto::v1::{self, SettleOutcome};

use crate::connection::Client;
use crate::error::Result;

impl Client {
    /// Takes one message (`auto_ack`: settled at once; otherwise held for `lease_ms`, 0 = the
    /// server's default of 30 s, until [`Client::settle`]).
    pub async fn get(&self, queue: &str, auto_ack: bool, lease_ms: u64) -> Result<v1::GetResponse> {
        let req = v1::GetRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            auto_ack,
            lease_ms,
        };
        Ok(self.raw().get(req).await?.into_inner())
    }

    /// Settles messages taken with [`Client::get`], in the order given.
    pub async fn settle(&self, receipts: Vec<String>, outcome: SettleOutcome) -> Result<()> {
        self.settle_with(receipts, outcome, None, None).await
    }

    /// [`Client::settle`] with its options: `reason_detail` (REJECT only, at most 1 024
    /// bytes) is recorded in the dead letter's `x-death` entry and `x-last-death-detail`;
    /// `delay_ms` (REQUEUE only, at most 7 days) keeps the message from being delivered
    /// before then (without it, the queue's `x-requeue-delays` apply).
    pub async fn settle_with(
        &self,
        receipts: Vec<String>,
        outcome: SettleOutcome,
        reason_detail: Option<String>,
        delay_ms: Option<u64>,
    ) -> Result<()> {
        let req = v1::SettleRequest {
            receipts,
            outcome: outcome as i32,
            reason_detail,
            delay_ms,
        };
        self.raw().settle(req).await?;
        Ok(())
    }

    /// The ready messages at positions `offset..offset + limit` of `queue`, in queue order,
    /// without taking them (`limit` at most 1 000; 0 means 100). Needs read permission.
    pub async fn browse(&self, queue: &str, offset: u64, limit: u32) -> Result<v1::BrowseResponse> {
        let req = v1::BrowseRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            offset,
            limit,
        };
        Ok(self.raw().browse(req).await?.into_inner())
    }
}
