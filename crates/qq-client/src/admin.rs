//! Administration calls on [`Client`]: move tasks (redrive), users, permissions, vhosts,
//! definitions and limits, and cluster membership (queue replicas, joining and forgetting
//! nodes).

use qq_proto::v1;

use crate::connection::Client;
use crate::error::Result;

impl Client {
    // ---- move tasks (redrive) ---------------------------------------------------------------

    /// Start moving up to `max_messages` (0: every) ready messages of `source` to
    /// `destination` (empty: each back to its `x-first-death-queue`), at most
    /// `max_per_second` (0: no limit). Returns the task id.
    pub async fn start_move_task(
        &self,
        source: &str,
        destination: &str,
        max_messages: u64,
        max_per_second: u32,
    ) -> Result<String> {
        let req = v1::StartMoveTaskRequest {
            vhost: self.vhost.clone(),
            source: source.into(),
            destination: destination.into(),
            max_messages,
            max_per_second,
        };
        Ok(self.raw().start_move_task(req).await?.into_inner().task_id)
    }

    /// A move task's state, `moved` and `remaining`.
    pub async fn get_move_task(&self, task_id: &str) -> Result<v1::MoveTask> {
        let req = v1::GetMoveTaskRequest {
            task_id: task_id.into(),
        };
        Ok(self.raw().get_move_task(req).await?.into_inner())
    }

    /// The move tasks of the client's vhost (running and recently ended).
    pub async fn list_move_tasks(&self) -> Result<Vec<v1::MoveTask>> {
        let req = v1::ListMoveTasksRequest {
            vhost: self.vhost.clone(),
        };
        Ok(self.raw().list_move_tasks(req).await?.into_inner().tasks)
    }

    /// Cancel a running move task (messages already moved stay moved).
    pub async fn cancel_move_task(&self, task_id: &str) -> Result<()> {
        let req = v1::CancelMoveTaskRequest {
            task_id: task_id.into(),
        };
        self.raw().cancel_move_task(req).await?;
        Ok(())
    }

    // ---- users and vhosts -----------------------------------------------------------------

    /// Creates or updates a user.
    pub async fn put_user(&self, name: &str, password: &str, tags: Vec<String>) -> Result<()> {
        let req = v1::PutUserRequest {
            name: name.into(),
            password: password.into(),
            tags,
            password_hash: String::new(),
        };
        self.raw().put_user(req).await?;
        Ok(())
    }

    /// Creates or updates a user with an Argon2id PHC string as `ExportDefinitions` gives it
    /// (the node validates it), instead of a password.
    pub async fn put_user_with_hash(
        &self,
        name: &str,
        password_hash: &str,
        tags: Vec<String>,
    ) -> Result<()> {
        let req = v1::PutUserRequest {
            name: name.into(),
            password: String::new(),
            tags,
            password_hash: password_hash.into(),
        };
        self.raw().put_user(req).await?;
        Ok(())
    }

    /// The cluster's definitions (users, vhosts, permissions, exchanges, queues, bindings,
    /// policies, limits) as one JSON document; administrators only.
    pub async fn export_definitions(&self) -> Result<String> {
        let r = self
            .raw()
            .export_definitions(v1::ExportDefinitionsRequest {})
            .await?;
        Ok(r.into_inner().definitions_json)
    }

    /// Imports a definitions document: all of it is checked first, then what is not already
    /// there is created; per kind, what was created, updated or already there.
    pub async fn import_definitions(&self, json: &str) -> Result<Vec<v1::ImportCount>> {
        let r = self
            .raw()
            .import_definitions(v1::ImportDefinitionsRequest {
                definitions_json: json.into(),
            })
            .await?;
        Ok(r.into_inner().counts)
    }

    /// Deletes a user.
    pub async fn delete_user(&self, name: &str) -> Result<()> {
        self.raw()
            .delete_user(v1::DeleteUserRequest { name: name.into() })
            .await?;
        Ok(())
    }

    /// Sets a user's permissions on a vhost (three regexes).
    pub async fn set_permissions(
        &self,
        user: &str,
        vhost: &str,
        configure: &str,
        write: &str,
        read: &str,
    ) -> Result<()> {
        let req = v1::SetPermissionsRequest {
            user: user.into(),
            vhost: vhost.into(),
            configure: configure.into(),
            write: write.into(),
            read: read.into(),
        };
        self.raw().set_permissions(req).await?;
        Ok(())
    }

    /// Creates a vhost.
    pub async fn put_vhost(&self, name: &str) -> Result<()> {
        self.raw()
            .put_vhost(v1::PutVhostRequest { name: name.into() })
            .await?;
        Ok(())
    }

    /// Deletes a vhost and everything in it.
    pub async fn delete_vhost(&self, name: &str) -> Result<()> {
        self.raw()
            .delete_vhost(v1::DeleteVhostRequest { name: name.into() })
            .await?;
        Ok(())
    }

    /// Replaces a vhost's limits (all `None`: clears them). Administrators only.
    pub async fn set_vhost_limits(&self, vhost: &str, limits: v1::Limits) -> Result<()> {
        self.raw()
            .set_vhost_limits(v1::SetVhostLimitsRequest {
                vhost: vhost.into(),
                limits: Some(limits),
            })
            .await?;
        Ok(())
    }

    /// Replaces a user's limits (all `None`: clears them). Administrators only.
    pub async fn set_user_limits(&self, user: &str, limits: v1::Limits) -> Result<()> {
        self.raw()
            .set_user_limits(v1::SetUserLimitsRequest {
                user: user.into(),
                limits: Some(limits),
            })
            .await?;
        Ok(())
    }

    /// Every vhost and user with limits set. Administrators only.
    pub async fn list_limits(&self) -> Result<v1::ListLimitsResponse> {
        Ok(self
            .raw()
            .list_limits(v1::ListLimitsRequest {})
            .await?
            .into_inner())
    }

    // Membership changes (issue 15). Administrators only.

    /// Adds `node` to the replicas of `queue` (in the client's vhost).
    pub async fn add_member(&self, queue: &str, node: u64) -> Result<v1::MemberChange> {
        let req = v1::MemberRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            node,
        };
        Ok(self.raw().add_member(req).await?.into_inner())
    }

    /// Removes `node` from the replicas of `queue` (in the client's vhost).
    pub async fn delete_member(&self, queue: &str, node: u64) -> Result<v1::MemberChange> {
        let req = v1::MemberRequest {
            vhost: self.vhost.clone(),
            queue: queue.into(),
            node,
        };
        Ok(self.raw().delete_member(req).await?.into_inner())
    }

    /// Adds `node` to every queue whose name matches `pattern` (in `vhost`; empty: every
    /// vhost).
    pub async fn grow_queues(
        &self,
        node: u64,
        pattern: &str,
        vhost: &str,
    ) -> Result<Vec<v1::MemberChange>> {
        let req = v1::GrowQueuesRequest {
            node,
            pattern: pattern.into(),
            vhost: vhost.into(),
        };
        Ok(self.raw().grow_queues(req).await?.into_inner().changes)
    }

    /// Removes `node` from every queue where it is a member and not the last one.
    pub async fn shrink_queues(&self, node: u64) -> Result<Vec<v1::MemberChange>> {
        let req = v1::ShrinkQueuesRequest { node };
        Ok(self.raw().shrink_queues(req).await?.into_inner().changes)
    }

    /// Moves queue leaders so each node leads about as many as the others.
    pub async fn rebalance_leaders(&self) -> Result<v1::RebalanceLeadersResponse> {
        Ok(self
            .raw()
            .rebalance_leaders(v1::RebalanceLeadersRequest {})
            .await?
            .into_inner())
    }

    /// The queues that would lose their majority if `node` stopped now.
    pub async fn quorum_critical(&self, node: u64) -> Result<v1::QuorumCriticalResponse> {
        Ok(self
            .raw()
            .quorum_critical(v1::QuorumCriticalRequest { node })
            .await?
            .into_inner())
    }

    /// Lets node `id` (started, empty, configured with the cluster's peers and itself) join
    /// the running cluster. `address`: its client address; `cluster_address`: its node-to-node
    /// address. Returns why nothing changed, or an empty string.
    pub async fn join_node(&self, id: u64, address: &str, cluster_address: &str) -> Result<String> {
        let req = v1::JoinNodeRequest {
            id,
            address: address.into(),
            cluster_address: cluster_address.into(),
        };
        Ok(self.raw().join_node(req).await?.into_inner().detail)
    }

    /// Forgets the stopped node `id` for good: its queue replicas are deleted first.
    pub async fn forget_node(&self, id: u64) -> Result<Vec<v1::MemberChange>> {
        let req = v1::ForgetNodeRequest { id };
        Ok(self.raw().forget_node(req).await?.into_inner().changes)
    }
}
