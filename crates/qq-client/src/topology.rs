//! Topology and inspection calls on [`Client`]: exchanges, queues and bindings, listing
//! them with the cluster status and overview, and policies.

use std::collections::HashMap;

use qq_proto::v1::{
    self, BindingInfo, ClusterStatusResponse, ExchangeInfo, OverviewResponse, Policy, QueueInfo,
    Value,
};

use crate::connection::Client;
use crate::error::Result;

impl Client {
    // ---- topology -------------------------------------------------------------------------

    /// Declares an exchange of `kind` (`direct`, `fanout`, `topic`, `headers`), durable.
    pub async fn declare_exchange(&self, name: &str, kind: &str) -> Result<()> {
        self.declare_exchange_with(v1::DeclareExchangeRequest {
            name: name.into(),
            r#type: kind.into(),
            durable: true,
            ..Default::default()
        })
        .await
    }

    /// Declares an exchange from a full request (the vhost is filled in when empty).
    pub async fn declare_exchange_with(&self, mut req: v1::DeclareExchangeRequest) -> Result<()> {
        self.fill_vhost(&mut req.vhost);
        self.raw().declare_exchange(req).await?;
        Ok(())
    }

    /// Deletes an exchange.
    pub async fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<()> {
        let req = v1::DeleteExchangeRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            if_unused,
        };
        self.raw().delete_exchange(req).await?;
        Ok(())
    }

    /// Declares a quorum queue with `arguments` (`x-max-length`, `x-message-ttl`, …).
    pub async fn declare_queue(
        &self,
        name: &str,
        arguments: HashMap<String, Value>,
    ) -> Result<v1::DeclareQueueResponse> {
        let req = v1::DeclareQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            arguments,
            passive: false,
        };
        Ok(self.raw().declare_queue(req).await?.into_inner())
    }

    /// Checks that a queue exists (passive declare) and returns its counts.
    pub async fn declare_queue_passive(&self, name: &str) -> Result<v1::DeclareQueueResponse> {
        let req = v1::DeclareQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            arguments: HashMap::new(),
            passive: true,
        };
        Ok(self.raw().declare_queue(req).await?.into_inner())
    }

    /// Deletes a queue; returns the number of messages it held.
    pub async fn delete_queue(&self, name: &str, if_unused: bool, if_empty: bool) -> Result<u64> {
        let req = v1::DeleteQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            if_unused,
            if_empty,
        };
        Ok(self
            .raw()
            .delete_queue(req)
            .await?
            .into_inner()
            .message_count)
    }

    /// Removes every ready message; returns how many.
    pub async fn purge_queue(&self, name: &str) -> Result<u64> {
        let req = v1::PurgeQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
        };
        Ok(self
            .raw()
            .purge_queue(req)
            .await?
            .into_inner()
            .message_count)
    }

    /// Binds `queue` to `exchange` with `routing_key` (and `arguments`, for headers exchanges).
    pub async fn bind(
        &self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: HashMap<String, Value>,
    ) -> Result<()> {
        let req = self.bind_request(queue, exchange, routing_key, arguments);
        self.raw().bind_queue(req).await?;
        Ok(())
    }

    /// Removes a binding (the same four fields as [`Client::bind`]).
    pub async fn unbind(
        &self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: HashMap<String, Value>,
    ) -> Result<()> {
        let req = self.bind_request(queue, exchange, routing_key, arguments);
        self.raw().unbind_queue(req).await?;
        Ok(())
    }

    fn bind_request(
        &self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: HashMap<String, Value>,
    ) -> v1::BindRequest {
        v1::BindRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            arguments,
        }
    }

    // ---- inspection -----------------------------------------------------------------------

    /// Every queue of the vhost.
    pub async fn list_queues(&self) -> Result<Vec<QueueInfo>> {
        let req = v1::ListQueuesRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_queues(req).await?.into_inner().queues)
    }

    /// One queue, answered by (or forwarded to) its leader.
    pub async fn get_queue(&self, name: &str) -> Result<QueueInfo> {
        let req = v1::GetQueueRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
        };
        Ok(self.raw().get_queue(req).await?.into_inner())
    }

    /// Every exchange of the vhost.
    pub async fn list_exchanges(&self) -> Result<Vec<ExchangeInfo>> {
        let req = v1::ListExchangesRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_exchanges(req).await?.into_inner().exchanges)
    }

    /// Every binding of the vhost.
    pub async fn list_bindings(&self) -> Result<Vec<BindingInfo>> {
        let req = v1::ListBindingsRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_bindings(req).await?.into_inner().bindings)
    }

    /// Nodes, their reachability, the metadata leader and every queue's leader, as this node
    /// sees them.
    pub async fn cluster_status(&self) -> Result<ClusterStatusResponse> {
        Ok(self
            .raw()
            .cluster_status(v1::ClusterStatusRequest {})
            .await?
            .into_inner())
    }

    /// Cluster-wide counters.
    pub async fn overview(&self) -> Result<OverviewResponse> {
        Ok(self
            .raw()
            .overview(v1::OverviewRequest {})
            .await?
            .into_inner())
    }

    // ---- policies -------------------------------------------------------------------------

    /// Sets (creates or replaces) a policy.
    pub async fn set_policy(
        &self,
        name: &str,
        pattern: &str,
        apply_to: &str,
        priority: i64,
        definition: HashMap<String, Value>,
    ) -> Result<()> {
        let req = self.policy_request(name, pattern, apply_to, priority, definition);
        self.raw().set_policy(req).await?;
        Ok(())
    }

    /// Removes a policy.
    pub async fn clear_policy(&self, name: &str) -> Result<()> {
        let req = v1::ClearPolicyRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
        };
        self.raw().clear_policy(req).await?;
        Ok(())
    }

    /// Every policy of the vhost.
    pub async fn list_policies(&self) -> Result<Vec<Policy>> {
        let req = v1::ListPoliciesRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_policies(req).await?.into_inner().policies)
    }

    /// Binds exchange `destination` to exchange `source`: what `source` routes by this
    /// binding, `destination` routes on (`BindExchange`).
    pub async fn bind_exchange(
        &self,
        destination: &str,
        source: &str,
        routing_key: &str,
        arguments: HashMap<String, Value>,
    ) -> Result<()> {
        let req = self.exchange_bind_request(destination, source, routing_key, arguments);
        self.raw().bind_exchange(req).await?;
        Ok(())
    }

    /// Removes an exchange-to-exchange binding (the same four fields).
    pub async fn unbind_exchange(
        &self,
        destination: &str,
        source: &str,
        routing_key: &str,
        arguments: HashMap<String, Value>,
    ) -> Result<()> {
        let req = self.exchange_bind_request(destination, source, routing_key, arguments);
        self.raw().unbind_exchange(req).await?;
        Ok(())
    }

    fn exchange_bind_request(
        &self,
        destination: &str,
        source: &str,
        routing_key: &str,
        arguments: HashMap<String, Value>,
    ) -> v1::ExchangeBindRequest {
        v1::ExchangeBindRequest {
            vhost: self.vhost.clone(),
            destination: destination.into(),
            source: source.into(),
            routing_key: routing_key.into(),
            arguments,
        }
    }

    /// Sets an operator policy: limits (`max-length`, `max-length-bytes`, `message-ttl`,
    /// `delivery-limit`, `expires`) imposed over the users' own; the stricter wins.
    pub async fn set_operator_policy(
        &self,
        name: &str,
        pattern: &str,
        apply_to: &str,
        priority: i64,
        definition: HashMap<String, Value>,
    ) -> Result<()> {
        let req = self.policy_request(name, pattern, apply_to, priority, definition);
        self.raw().set_operator_policy(req).await?;
        Ok(())
    }

    /// Removes an operator policy.
    pub async fn clear_operator_policy(&self, name: &str) -> Result<()> {
        let req = v1::ClearPolicyRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
        };
        self.raw().clear_operator_policy(req).await?;
        Ok(())
    }

    /// Every operator policy of the vhost.
    pub async fn list_operator_policies(&self) -> Result<Vec<Policy>> {
        let req = v1::ListPoliciesRequest {
            vhost: self.vhost.clone(),
        };
        let reply = self.raw().list_operator_policies(req).await?;
        Ok(reply.into_inner().policies)
    }

    fn policy_request(
        &self,
        name: &str,
        pattern: &str,
        apply_to: &str,
        priority: i64,
        definition: HashMap<String, Value>,
    ) -> v1::SetPolicyRequest {
        v1::SetPolicyRequest {
            vhost: self.vhost.clone(),
            name: name.into(),
            pattern: pattern.into(),
            apply_to: apply_to.into(),
            priority,
            definition,
        }
    }
}
