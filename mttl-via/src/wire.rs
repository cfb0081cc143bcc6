//! How values cross process boundaries: the [`Wire`] encoding (little
//! endian, length-prefixed sequences) for invoke arguments and results, and
//! the [`Pod`] marker for plain data that `GlobalPtr` moves as raw bytes.
//!
//! Decoding never trusts its input: a short or malformed buffer gives a
//! [`WireError`], never a panic.

use std::fmt;

/// A buffer did not hold a value of the expected type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed message: {}", self.0)
    }
}

impl std::error::Error for WireError {}

/// A value that can be sent to another process.
pub trait Wire: Sized {
    /// Appends the encoding of `self` to `out`.
    fn put(&self, out: &mut Vec<u8>);
    /// Takes one value off the front of `inp`.
    fn get(inp: &mut &[u8]) -> Result<Self, WireError>;
}

/// Takes `n` bytes off the front of `inp`.
pub fn take<'a>(inp: &mut &'a [u8], n: usize) -> Result<&'a [u8], WireError> {
    if inp.len() < n {
        return Err(WireError(format!("needed {n} more bytes, {} left", inp.len())));
    }
    let (a, b) = inp.split_at(n);
    *inp = b;
    Ok(a)
}

/// Encodes one value into a new buffer.
pub fn encode<T: Wire>(v: &T) -> Vec<u8> {
    let mut out = Vec::new();
    v.put(&mut out);
    out
}

/// Decodes a whole buffer as one value (trailing bytes are an error).
pub fn decode<T: Wire>(mut b: &[u8]) -> Result<T, WireError> {
    let v = T::get(&mut b)?;
    if !b.is_empty() {
        return Err(WireError(format!("{} bytes left over after the value", b.len())));
    }
    Ok(v)
}

macro_rules! wire_num {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            fn put(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
                let b = take(inp, std::mem::size_of::<$t>())?;
                Ok(<$t>::from_le_bytes(b.try_into().expect("length checked")))
            }
        }
    )*};
}
wire_num!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128, f32, f64);

impl Wire for usize {
    fn put(&self, out: &mut Vec<u8>) {
        (*self as u64).put(out)
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        usize::try_from(u64::get(inp)?).map_err(|_| WireError("usize out of range".into()))
    }
}

impl Wire for isize {
    fn put(&self, out: &mut Vec<u8>) {
        (*self as i64).put(out)
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        isize::try_from(i64::get(inp)?).map_err(|_| WireError("isize out of range".into()))
    }
}

impl Wire for bool {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self as u8)
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        match take(inp, 1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(WireError(format!("bool byte {b}"))),
        }
    }
}

impl Wire for () {
    fn put(&self, _: &mut Vec<u8>) {}
    fn get(_: &mut &[u8]) -> Result<Self, WireError> {
        Ok(())
    }
}

/// Sequence lengths are u32: no message holds more than 4 Gi elements.
fn get_len(inp: &mut &[u8]) -> Result<usize, WireError> {
    let n = u32::get(inp)? as usize;
    // Every element takes at least one byte except zero-sized ones; a length
    // beyond the buffer is a lie for any type we encode with content.
    Ok(n)
}

impl<T: Wire> Wire for Vec<T> {
    fn put(&self, out: &mut Vec<u8>) {
        (self.len() as u32).put(out);
        for v in self {
            v.put(out);
        }
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        let n = get_len(inp)?;
        let mut v = Vec::with_capacity(n.min(inp.len()));
        for _ in 0..n {
            v.push(T::get(inp)?);
        }
        Ok(v)
    }
}

impl Wire for String {
    fn put(&self, out: &mut Vec<u8>) {
        (self.len() as u32).put(out);
        out.extend_from_slice(self.as_bytes());
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        let n = get_len(inp)?;
        String::from_utf8(take(inp, n)?.to_vec()).map_err(|e| WireError(e.to_string()))
    }
}

impl<T: Wire> Wire for Option<T> {
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                v.put(out)
            }
        }
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        Ok(if bool::get(inp)? { Some(T::get(inp)?) } else { None })
    }
}

impl<T: Wire, const N: usize> Wire for [T; N] {
    fn put(&self, out: &mut Vec<u8>) {
        for v in self {
            v.put(out);
        }
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        let mut v = Vec::with_capacity(N);
        for _ in 0..N {
            v.push(T::get(inp)?);
        }
        v.try_into().map_err(|_| WireError("array length".into()))
    }
}

macro_rules! wire_tuple {
    ($($n:ident),+) => {
        impl<$($n: Wire),+> Wire for ($($n,)+) {
            #[allow(non_snake_case)]
            fn put(&self, out: &mut Vec<u8>) {
                let ($($n,)+) = self;
                $($n.put(out);)+
            }
            fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
                Ok(($($n::get(inp)?,)+))
            }
        }
    };
}
wire_tuple!(A);
wire_tuple!(A, B);
wire_tuple!(A, B, C);
wire_tuple!(A, B, C, D);
wire_tuple!(A, B, C, D, E);
wire_tuple!(A, B, C, D, E, F);
wire_tuple!(A, B, C, D, E, F, G);
wire_tuple!(A, B, C, D, E, F, G, H);

/// Plain data: any bit pattern of the right size is a valid value, there
/// are no pointers or padding, so `GlobalPtr` may copy it as raw bytes.
///
/// # Safety
/// Implement only for types with no padding, no invalid bit patterns and
/// no pointers (integers, floats, arrays of them, `#[repr(C)]` structs of
/// them without padding).
pub unsafe trait Pod: Copy + 'static {}

macro_rules! pod {
    ($($t:ty),*) => {$(
        // SAFETY: primitive numbers: every bit pattern valid, no padding.
        unsafe impl Pod for $t {}
    )*};
}
pod!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64);
// SAFETY: an array of plain data is plain data (no padding between elements).
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// The bytes of a slice of plain data.
pub fn pod_bytes<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: T is Pod (no padding, so every byte is initialised); the
    // length is the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// The bytes of a mutable slice of plain data.
pub fn pod_bytes_mut<T: Pod>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: T is Pod, so any bytes written make valid values.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let v = (7u8, -3i64, 2.5f64, vec![1u32, 2, 3], String::from("héllo"), Some(9u16), [1u8, 2, 3]);
        assert_eq!(decode::<(u8, i64, f64, Vec<u32>, String, Option<u16>, [u8; 3])>(&encode(&v)).unwrap(), v);
    }

    #[test]
    fn short_and_trailing_input_is_an_error() {
        let b = encode(&(1u64, 2u64));
        assert!(decode::<(u64, u64)>(&b[..15]).is_err());
        assert!(decode::<u64>(&b).is_err());
        assert!(decode::<bool>(&[2]).is_err());
        // A length that claims more elements than there are bytes.
        let mut lie = Vec::new();
        u32::MAX.put(&mut lie);
        assert!(decode::<Vec<u64>>(&lie).is_err());
        assert!(decode::<String>(&lie).is_err());
    }
}
