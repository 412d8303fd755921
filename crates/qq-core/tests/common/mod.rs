//! Helpers shared by the queue state machine's test files.

use qq_core::queue::Effect;
use qq_core::types::{ConsumerId, MessageId};

/// The (consumer, message) of every delivery among `fx`, in order.
pub fn deliveries(fx: &[Effect]) -> Vec<(ConsumerId, MessageId)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Deliver(d) => Some((d.consumer, d.id)),
            _ => None,
        })
        .collect()
}
