//! Operator policies (metadata machine version 2): limits an operator imposes on the queues
//! of a vhost over what users ask, as RabbitMQ's operator policies. Of the user's value
//! (argument or policy, [`policy::effective_config`]) and the operator's, the stricter wins
//! ([`policy::apply_operator_policy`]).

use super::*;

impl MetaState {
    pub(super) fn set_operator_policy(
        &mut self,
        vhost: &str,
        policy: Policy,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        check_name("policy", &policy.name)?;
        compile("pattern", &policy.pattern)?;
        policy::validate_operator_policy(&policy)?;
        v.operator_policies.insert(policy.name.clone(), policy);
        recompute_configs(vhost, v, effects);
        Ok(MetaReply::Ok)
    }

    pub(super) fn clear_operator_policy(
        &mut self,
        vhost: &str,
        name: &str,
        effects: &mut Vec<MetaEffect>,
    ) -> Result<MetaReply, MetaError> {
        let v = self.vhost_mut(vhost)?;
        v.operator_policies.remove(name).ok_or_else(|| {
            MetaError::not_found(format!(
                "no operator policy '{}' in vhost '{}'",
                shown(name),
                shown(vhost)
            ))
        })?;
        recompute_configs(vhost, v, effects);
        Ok(MetaReply::Ok)
    }

    /// The operator policies of a vhost (none for a missing one), by name.
    pub fn operator_policies(&self, vhost: &str) -> impl Iterator<Item = &Policy> {
        self.vhosts
            .get(vhost)
            .into_iter()
            .flat_map(|v| v.operator_policies.values())
    }

    /// The operator policy that applies to queue `q`, if any.
    pub fn operator_policy_of(&self, q: &QueueMeta) -> Option<&Policy> {
        let v = self.vhosts.get(&q.vhost)?;
        policy::matching_policy(v.operator_policies.values(), &q.name)
    }
}

impl Vhost {
    /// The effective configuration of queue `name` declared with `arguments` in this vhost
    /// (named `vhost`): its arguments under the matching policy, then the matching operator
    /// policy's limits.
    pub(super) fn queue_config(&self, vhost: &str, name: &str, arguments: &Table) -> QueueConfig {
        let matching = policy::matching_policy(self.policies.values(), name);
        let mut config = policy::effective_config(vhost, name, arguments, matching);
        let operator = policy::matching_policy(self.operator_policies.values(), name);
        policy::apply_operator_policy(&mut config, operator);
        config
    }
}

/// Recomputes the effective configuration of every queue of `v` and reports those that changed.
pub(super) fn recompute_configs(vhost: &str, v: &mut Vhost, effects: &mut Vec<MetaEffect>) {
    let changed: Vec<(String, QueueConfig)> = v
        .queues
        .values()
        .filter_map(|q| {
            let config = v.queue_config(vhost, &q.name, &q.arguments);
            (config != q.config).then(|| (q.name.clone(), config))
        })
        .collect();
    for (name, config) in changed {
        if let Some(queue) = v.queues.get_mut(&name) {
            queue.config = config;
            effects.push(MetaEffect::QueueConfigChanged(queue.clone()));
        }
    }
}
