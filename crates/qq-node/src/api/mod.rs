//! The client API, `qq.v1.Broker` (docs/api.md), as thin adapters over the node.
//!
//! One file per area: [`auth`] (who is calling and what they may do: the only place
//! permissions are decided), [`publish`], [`consume`] (Get, Settle, Consume), [`browse`],
//! [`moves`] (move tasks), [`guard`] (the bound of names, visibility of queues by id), [`admin`]
//! (declare, delete, bind, policies, users, vhosts) and [`status`] (lists, queue info,
//! cluster status, overview). Each handler decodes and validates its request (naming the
//! field), checks the caller, reads the metadata view or calls the domain (proposer, enqueue,
//! consumer sessions), and maps the typed error to a status: the node's errors through
//! `From<NodeError> for Status` ([`crate::error`]), the core's through
//! [`convert::meta_error_to_status`].
//!
//! Must not: hold a lock of the node across an await, or reach into a state machine.

pub mod admin;
pub mod auth;
pub mod browse;
pub mod conn;
pub mod consume;
pub mod convert;
pub mod definitions;
pub mod guard;
pub mod members;
pub mod moves;
pub mod publish;
pub mod serving;
pub mod status;

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use qq_core::meta::{MetaCommand, MetaReply, QueueMeta};
use qq_proto::v1 as pb;
use qq_proto::v1::broker_server::Broker;
use tonic::{Request, Response, Status, Streaming};
use tracing::instrument;

use self::auth::{Auth, AuthSettings, Caller};
use self::conn::Connections;
use self::convert::meta_error_to_status;
use self::serving::Serving;

pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// What every handler works with. Cheap to clone.
#[derive(Clone)]
pub struct Api {
    node: Arc<Serving>,
    auth: Arc<Auth>,
    conns: Arc<Connections>,
}

impl Api {
    /// Who is calling and what they may do (the management page logs in through it too).
    pub(crate) fn auth(&self) -> &Arc<Auth> {
        &self.auth
    }

    pub(crate) fn node(&self) -> &Serving {
        &self.node
    }

    /// The client connections this node counts (gRPC and AMQP alike).
    pub(crate) fn conns(&self) -> &Arc<Connections> {
        &self.conns
    }

    /// Propose a metadata command; a refusal becomes its status.
    async fn meta(&self, cmd: MetaCommand) -> Result<MetaReply, Status> {
        self.node
            .proposer()
            .propose_meta(cmd)
            .await?
            .map_err(|e| meta_error_to_status(&e))
    }

    /// The caller, who must be an administrator.
    async fn admin<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let caller = self.auth.caller(request).await?;
        self.auth.require_admin(&caller)?;
        Ok(caller)
    }

    /// A queue by name, NOT_FOUND naming the vhost or the queue.
    fn queue_meta(&self, vhost: &str, name: &str) -> Result<QueueMeta, Status> {
        if name.is_empty() {
            return Err(Status::invalid_argument("queue: a queue name is required"));
        }
        let state = self.node.view().current();
        if !state.vhost_exists(vhost) {
            return Err(Status::not_found(format!(
                "vhost '{}' not found",
                guard::shown(vhost)
            )));
        }
        state.queue(vhost, name).cloned().ok_or_else(|| {
            Status::not_found(format!(
                "queue '{}' in vhost '{}' not found",
                guard::shown(name),
                guard::shown(vhost)
            ))
        })
    }
}

/// The `qq.v1.Broker` service.
pub struct BrokerService {
    api: Api,
}

impl BrokerService {
    /// `conns`: the client port's connections (see [`conn`]), counted by the server's accept.
    pub fn new(node: Serving, conns: Arc<Connections>) -> BrokerService {
        let config = node.config();
        // With tls_cert the client port serves only TLS (server.rs), so Basic credentials
        // never cross the network in clear.
        let settings = AuthSettings {
            loopback_users: config.loopback_users.clone(),
            allow_plaintext_auth: config.allow_plaintext_auth,
            client_tls: config.tls_cert.is_some(),
        };
        let auth = Arc::new(Auth::new(
            node.view().clone(),
            node.meta_synced(),
            settings,
            conns.clone(),
            node.clock(),
        ));
        BrokerService {
            api: Api {
                node: Arc::new(node),
                auth,
                conns,
            },
        }
    }

    /// The handlers' shared state, for the management page on `http_addr`
    /// ([`crate::observe::page`]), which reads through the same functions.
    pub fn api(&self) -> Api {
        self.api.clone()
    }
}

type Unary<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Broker for BrokerService {
    #[instrument(skip_all, fields(exchange = %request.get_ref().name))]
    async fn declare_exchange(
        &self,
        request: Request<pb::DeclareExchangeRequest>,
    ) -> Unary<pb::Empty> {
        admin::declare_exchange(&self.api, request).await
    }

    async fn delete_exchange(
        &self,
        request: Request<pb::DeleteExchangeRequest>,
    ) -> Unary<pb::Empty> {
        admin::delete_exchange(&self.api, request).await
    }

    #[instrument(skip_all, fields(queue = %request.get_ref().name))]
    async fn declare_queue(
        &self,
        request: Request<pb::DeclareQueueRequest>,
    ) -> Unary<pb::DeclareQueueResponse> {
        admin::declare_queue(&self.api, request).await
    }

    async fn delete_queue(
        &self,
        request: Request<pb::DeleteQueueRequest>,
    ) -> Unary<pb::DeleteQueueResponse> {
        admin::delete_queue(&self.api, request).await
    }

    async fn purge_queue(
        &self,
        request: Request<pb::PurgeQueueRequest>,
    ) -> Unary<pb::PurgeQueueResponse> {
        admin::purge_queue(&self.api, request).await
    }

    async fn bind_queue(&self, request: Request<pb::BindRequest>) -> Unary<pb::Empty> {
        admin::binding(&self.api, request, true).await
    }

    async fn unbind_queue(&self, request: Request<pb::BindRequest>) -> Unary<pb::Empty> {
        admin::binding(&self.api, request, false).await
    }

    async fn publish(&self, request: Request<pb::PublishRequest>) -> Unary<pb::PublishResponse> {
        publish::publish(&self.api, request).await
    }

    type PublishStreamStream = BoxStream<pb::PublishResponse>;

    async fn publish_stream(
        &self,
        request: Request<Streaming<pb::PublishRequest>>,
    ) -> Unary<Self::PublishStreamStream> {
        publish::publish_stream(&self.api, request).await
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> Unary<pb::GetResponse> {
        consume::get(&self.api, request).await
    }

    async fn settle(&self, request: Request<pb::SettleRequest>) -> Unary<pb::Empty> {
        consume::settle(&self.api, request).await
    }

    type ConsumeStream = BoxStream<pb::ConsumeResponse>;

    async fn consume(
        &self,
        request: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Unary<Self::ConsumeStream> {
        consume::consume(&self.api, request).await
    }

    async fn set_policy(&self, request: Request<pb::SetPolicyRequest>) -> Unary<pb::Empty> {
        admin::set_policy(&self.api, request, false).await
    }

    async fn clear_policy(&self, request: Request<pb::ClearPolicyRequest>) -> Unary<pb::Empty> {
        admin::clear_policy(&self.api, request, false).await
    }

    async fn list_policies(
        &self,
        request: Request<pb::ListPoliciesRequest>,
    ) -> Unary<pb::ListPoliciesResponse> {
        status::list_policies(&self.api, request, false).await
    }

    async fn bind_exchange(&self, request: Request<pb::ExchangeBindRequest>) -> Unary<pb::Empty> {
        admin::exchange_binding(&self.api, request, true).await
    }

    async fn unbind_exchange(&self, request: Request<pb::ExchangeBindRequest>) -> Unary<pb::Empty> {
        admin::exchange_binding(&self.api, request, false).await
    }

    async fn set_operator_policy(
        &self,
        request: Request<pb::SetPolicyRequest>,
    ) -> Unary<pb::Empty> {
        admin::set_policy(&self.api, request, true).await
    }

    async fn clear_operator_policy(
        &self,
        request: Request<pb::ClearPolicyRequest>,
    ) -> Unary<pb::Empty> {
        admin::clear_policy(&self.api, request, true).await
    }

    async fn list_operator_policies(
        &self,
        request: Request<pb::ListPoliciesRequest>,
    ) -> Unary<pb::ListPoliciesResponse> {
        status::list_policies(&self.api, request, true).await
    }

    async fn list_queues(
        &self,
        request: Request<pb::ListQueuesRequest>,
    ) -> Unary<pb::ListQueuesResponse> {
        status::list_queues(&self.api, request).await
    }

    async fn get_queue(&self, request: Request<pb::GetQueueRequest>) -> Unary<pb::QueueInfo> {
        status::get_queue(&self.api, request).await
    }

    async fn list_exchanges(
        &self,
        request: Request<pb::ListExchangesRequest>,
    ) -> Unary<pb::ListExchangesResponse> {
        status::list_exchanges(&self.api, request).await
    }

    async fn list_bindings(
        &self,
        request: Request<pb::ListBindingsRequest>,
    ) -> Unary<pb::ListBindingsResponse> {
        status::list_bindings(&self.api, request).await
    }

    async fn put_user(&self, request: Request<pb::PutUserRequest>) -> Unary<pb::Empty> {
        admin::put_user(&self.api, request).await
    }

    async fn delete_user(&self, request: Request<pb::DeleteUserRequest>) -> Unary<pb::Empty> {
        admin::delete_user(&self.api, request).await
    }

    async fn set_permissions(
        &self,
        request: Request<pb::SetPermissionsRequest>,
    ) -> Unary<pb::Empty> {
        admin::set_permissions(&self.api, request).await
    }

    async fn put_vhost(&self, request: Request<pb::PutVhostRequest>) -> Unary<pb::Empty> {
        admin::put_vhost(&self.api, request).await
    }

    async fn delete_vhost(&self, request: Request<pb::DeleteVhostRequest>) -> Unary<pb::Empty> {
        admin::delete_vhost(&self.api, request).await
    }

    async fn cluster_status(
        &self,
        request: Request<pb::ClusterStatusRequest>,
    ) -> Unary<pb::ClusterStatusResponse> {
        status::cluster_status(&self.api, request).await
    }

    async fn overview(&self, request: Request<pb::OverviewRequest>) -> Unary<pb::OverviewResponse> {
        status::overview(&self.api, request).await
    }

    #[instrument(skip_all)]
    async fn browse(&self, request: Request<pb::BrowseRequest>) -> Unary<pb::BrowseResponse> {
        browse::browse(&self.api, request).await
    }

    async fn set_vhost_limits(
        &self,
        request: Request<pb::SetVhostLimitsRequest>,
    ) -> Unary<pb::Empty> {
        admin::set_vhost_limits(&self.api, request).await
    }

    async fn set_user_limits(
        &self,
        request: Request<pb::SetUserLimitsRequest>,
    ) -> Unary<pb::Empty> {
        admin::set_user_limits(&self.api, request).await
    }

    async fn list_limits(
        &self,
        request: Request<pb::ListLimitsRequest>,
    ) -> Unary<pb::ListLimitsResponse> {
        status::list_limits(&self.api, request).await
    }

    #[instrument(skip_all)]
    async fn start_move_task(
        &self,
        request: Request<pb::StartMoveTaskRequest>,
    ) -> Unary<pb::StartMoveTaskResponse> {
        moves::start(&self.api, request).await
    }

    async fn get_move_task(&self, request: Request<pb::GetMoveTaskRequest>) -> Unary<pb::MoveTask> {
        moves::get(&self.api, request).await
    }

    async fn list_move_tasks(
        &self,
        request: Request<pb::ListMoveTasksRequest>,
    ) -> Unary<pb::ListMoveTasksResponse> {
        moves::list(&self.api, request).await
    }

    #[instrument(skip_all)]
    async fn cancel_move_task(
        &self,
        request: Request<pb::CancelMoveTaskRequest>,
    ) -> Unary<pb::Empty> {
        moves::cancel(&self.api, request).await
    }

    #[instrument(skip_all)]
    async fn export_definitions(
        &self,
        request: Request<pb::ExportDefinitionsRequest>,
    ) -> Unary<pb::ExportDefinitionsResponse> {
        definitions::export(&self.api, request).await
    }

    #[instrument(skip_all)]
    async fn import_definitions(
        &self,
        request: Request<pb::ImportDefinitionsRequest>,
    ) -> Unary<pb::ImportDefinitionsResponse> {
        definitions::import(&self.api, request).await
    }

    // Membership changes (issue 15).
    async fn add_member(&self, request: Request<pb::MemberRequest>) -> Unary<pb::MemberChange> {
        members::add_member(&self.api, request).await
    }
    async fn delete_member(&self, request: Request<pb::MemberRequest>) -> Unary<pb::MemberChange> {
        members::delete_member(&self.api, request).await
    }
    async fn grow_queues(
        &self,
        request: Request<pb::GrowQueuesRequest>,
    ) -> Unary<pb::MemberChanges> {
        members::grow(&self.api, request).await
    }
    async fn shrink_queues(
        &self,
        request: Request<pb::ShrinkQueuesRequest>,
    ) -> Unary<pb::MemberChanges> {
        members::shrink(&self.api, request).await
    }
    async fn rebalance_leaders(
        &self,
        request: Request<pb::RebalanceLeadersRequest>,
    ) -> Unary<pb::RebalanceLeadersResponse> {
        members::rebalance(&self.api, request).await
    }
    async fn quorum_critical(
        &self,
        request: Request<pb::QuorumCriticalRequest>,
    ) -> Unary<pb::QuorumCriticalResponse> {
        members::quorum_critical(&self.api, request).await
    }

    async fn join_node(
        &self,
        request: Request<pb::JoinNodeRequest>,
    ) -> Result<Response<pb::JoinNodeResponse>, Status> {
        members::join_node(&self.api, request).await
    }

    async fn forget_node(
        &self,
        request: Request<pb::ForgetNodeRequest>,
    ) -> Result<Response<pb::MemberChanges>, Status> {
        members::forget_node(&self.api, request).await
    }
}
