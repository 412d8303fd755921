use openraft::EntryPayload;
use openraft::vote::RaftLeaderId;

use super::*;
use crate::types::Request;

fn entry(index: u64, bytes: usize) -> openraft::alias::EntryOf<TypeConfig> {
    let log_id = openraft::alias::LogIdOf::<TypeConfig>::new(
        <openraft::alias::LeaderIdOf<TypeConfig>>::new(1, 1).to_committed(),
        index,
    );
    openraft::Entry {
        log_id,
        payload: EntryPayload::Normal(Request {
            payload: vec![0; bytes].into(),
        }),
    }
}

#[test]
fn appends_stop_at_the_byte_budget_but_carry_at_least_one_entry() {
    let mib = 1024 * 1024;
    let small: Vec<_> = (1..=300).map(|i| entry(i, 1024)).collect();
    assert_eq!(entries_within_budget(&small), 300, "300 KiB fit");
    let big: Vec<_> = (1..=10).map(|i| entry(i, mib)).collect();
    assert_eq!(
        entries_within_budget(&big),
        3,
        "4 MiB holds three 1 MiB entries"
    );
    let huge = vec![entry(1, 16 * mib), entry(2, 1)];
    assert_eq!(
        entries_within_budget(&huge),
        1,
        "one larger entry still goes alone"
    );
    assert_eq!(entries_within_budget(&[]), 0);
}
