//! postcard encoding into a buffer of the exact size.
//!
//! `postcard::to_stdvec` grows its buffer as it writes, so a 1 KiB message or a batch entry of
//! many was copied once per doubling. Measuring first (postcard's `Size` flavor walks the value
//! without writing) costs a walk of the value, not a copy of the bytes in it.

use postcard::ser_flavors::Size;
use serde::Serialize;

/// `v` encoded with postcard, allocated once at its exact length.
pub fn to_vec_exact<T: Serialize + ?Sized>(v: &T) -> postcard::Result<Vec<u8>> {
    let len = postcard::serialize_with_flavor(v, Size::default())?;
    postcard::to_extend(v, Vec::with_capacity(len))
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
}
