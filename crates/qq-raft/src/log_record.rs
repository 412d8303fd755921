//! How one Raft log entry is stored: the record in the `log` column family.
//!
//! A record is the postcard encoding of openraft's `Entry` followed by one byte, the record's
//! format ([`ENTRY_FORMAT`]). postcard's encoding ends where the entry ends, so the format byte
//! is what remains after decoding it: a release that changes how entries are encoded (an
//! openraft upgrade that changes `Entry`'s serde shape, say) raises the format, reads records
//! of the formats before it, and can tell each record's format without guessing. Release
//! 0.1.0 wrote no format byte; its records are converted once, when a database of layout 1 is
//! opened ([`crate::layout`]), so from layout 2 on every record ends with its format.
//!
//! A 0.1.0 binary reading a record of format 1 ignores the trailing byte (postcard's
//! `from_bytes` stops at the entry's end): the format byte alone never makes a downgrade
//! misread the log.
//!
//! What an entry's payload may hold (which commands) is versioned separately, by the machine
//! version its group's log has switched to before it.

use crate::types::TypeConfig;

/// The record format this binary writes and the newest it reads.
pub const ENTRY_FORMAT: u8 = 1;

type Entry = openraft::alias::EntryOf<TypeConfig>;

/// The record of `entry`, allocated once with room for its format byte.
pub fn encode(entry: &Entry) -> Result<Vec<u8>, postcard::Error> {
    let mut bytes = crate::encoding::to_vec_with_room(entry, 1)?;
    bytes.push(ENTRY_FORMAT);
    Ok(bytes)
}

/// The entry of `record`, or why it cannot be read.
pub fn decode(record: &[u8]) -> Result<Entry, String> {
    let (entry, rest) = postcard::take_from_bytes::<Entry>(record).map_err(|e| e.to_string())?;
    match rest {
        [ENTRY_FORMAT] => Ok(entry),
        [newer] if *newer > ENTRY_FORMAT => Err(format!(
            "record format {newer} is newer than this binary's ({ENTRY_FORMAT}): written by a \
             later release"
        )),
        [] => Err("no record format after the entry (a layout 1 record left unconverted)".into()),
        _ => Err(format!(
            "{} bytes after the entry, where one format byte belongs",
            rest.len()
        )),
    }
}

/// The record a layout 1 (release 0.1.0) record becomes: the same entry, now with its format.
pub(crate) fn from_layout_1(record: &[u8]) -> Vec<u8> {
    let mut converted = Vec::with_capacity(record.len() + 1);
    converted.extend_from_slice(record);
    converted.push(ENTRY_FORMAT);
    converted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Request;
    use openraft::entry::RaftEntry;
    use openraft::vote::RaftLeaderId;

    fn entry(index: u64, payload: &[u8]) -> Entry {
        let leader = <openraft::alias::LeaderIdOf<TypeConfig>>::new(3, 1).to_committed();
        Entry::new_normal(
            openraft::LogId::new(leader, index),
            Request {
                payload: payload.to_vec().into(),
            },
        )
    }

    #[test]
    fn a_record_is_the_entry_then_its_format() {
        let e = entry(7, b"\x01\x02\x03");
        let record = encode(&e).unwrap();
        assert_eq!(*record.last().unwrap(), ENTRY_FORMAT);
        assert_eq!(decode(&record).unwrap(), e);
        // What release 0.1.0's reader does: postcard::from_bytes stops at the entry's end.
        assert_eq!(postcard::from_bytes::<Entry>(&record).unwrap(), e);
    }

    #[test]
    fn a_layout_1_record_converts_to_the_same_entry() {
        // A payload ending in what looks like a format byte changes nothing: the format is
        // what follows the entry, not the record's last byte.
        let e = entry(9, &[ENTRY_FORMAT, 2, ENTRY_FORMAT]);
        let old = crate::encoding::to_vec_exact(&e).unwrap();
        assert!(decode(&old).unwrap_err().contains("unconverted"));
        assert_eq!(decode(&from_layout_1(&old)).unwrap(), e);
    }

    #[test]
    fn newer_and_damaged_records_are_refused_by_name() {
        let mut newer = encode(&entry(1, b"x")).unwrap();
        *newer.last_mut().unwrap() = ENTRY_FORMAT + 1;
        assert!(
            decode(&newer)
                .unwrap_err()
                .contains("newer than this binary's")
        );
        let mut long = encode(&entry(1, b"x")).unwrap();
        long.push(0);
        assert!(
            decode(&long)
                .unwrap_err()
                .contains("2 bytes after the entry")
        );
        assert!(decode(&[0xff]).is_err());
    }
}
