//! postcard encoding into a buffer of the exact size.
//!
//! `postcard::to_stdvec` grows its buffer as it writes, so a 1 KiB message or a batch entry of
//! many was copied once per doubling. Measuring first (postcard's `Size` flavor walks the value
//! without writing) costs a walk of the value, not a copy of the bytes in it.

use postcard::ser_flavors::Size;
use serde::Serialize;

/// `v` encoded with postcard, allocated once at its exact length.
pub fn to_vec_exact<T: Serialize + ?Sized>(v: &T) -> postcard::Result<Vec<u8>> {
    to_vec_with_room(v, 0)
}

/// `v` encoded with postcard in a buffer with room for `extra` more bytes, allocated once: a
/// caller that appends to the encoding (a log record's format byte) does not make the vector
/// grow, which would copy all of it again.
pub fn to_vec_with_room<T: Serialize + ?Sized>(v: &T, extra: usize) -> postcard::Result<Vec<u8>> {
    let len = postcard::serialize_with_flavor(v, Size::default())?;
    postcard::to_extend(v, Vec::with_capacity(len + extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_as_to_stdvec_and_no_spare_capacity() {
        let v = (7u64, "text".to_string(), vec![1u8; 3000], Some(-5i32));
        let exact = to_vec_exact(&v).unwrap();
        assert_eq!(exact, postcard::to_stdvec(&v).unwrap());
        assert_eq!(exact.capacity(), exact.len());
    }

    #[test]
    fn room_for_more_is_there_and_the_bytes_are_the_same() {
        let v = (7u64, vec![1u8; 3000]);
        let mut bytes = to_vec_with_room(&v, 1).unwrap();
        assert_eq!(bytes, postcard::to_stdvec(&v).unwrap());
        assert_eq!(bytes.capacity(), bytes.len() + 1);
        let before = bytes.as_ptr();
        bytes.push(9);
        assert_eq!(bytes.as_ptr(), before, "the push must not move the buffer");
    }
}
