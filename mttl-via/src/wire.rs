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

    /// Appends the encodings of `values`, one after another (a `Vec`'s
    /// elements). The numbers override it with one copy of the run.
    fn put_all(values: &[Self], out: &mut Vec<u8>) {
        for v in values {
            v.put(out);
        }
    }

    /// Takes `n` values off the front of `inp`, as [`Wire::put_all`] put
    /// them. The numbers override it with one pass over the run.
    fn get_all(n: usize, inp: &mut &[u8]) -> Result<Vec<Self>, WireError> {
        // A length beyond the buffer is a lie for any type with content:
        // allocate no more than the bytes left could hold.
        let mut v = Vec::with_capacity(n.min(inp.len()));
        for _ in 0..n {
            v.push(Self::get(inp)?);
        }
        Ok(v)
    }
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
            // A run of numbers is their little-endian bytes in order: on a
            // little-endian machine, their memory, copied once each way (a
            // 1 KiB Vec<u8> went byte by byte: ~3 us of an invoke).
            fn put_all(values: &[Self], out: &mut Vec<u8>) {
                if cfg!(target_endian = "little") {
                    out.extend_from_slice(pod_bytes(values));
                } else {
                    for v in values {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
            fn get_all(n: usize, inp: &mut &[u8]) -> Result<Vec<Self>, WireError> {
                const SIZE: usize = std::mem::size_of::<$t>();
                let bytes = n.checked_mul(SIZE).ok_or_else(|| WireError(format!("{n} elements of {SIZE} bytes")))?;
                let b = take(inp, bytes)?;
                if cfg!(target_endian = "little") {
                    let mut v = vec![<$t>::default(); n];
                    pod_bytes_mut(&mut v).copy_from_slice(b);
                    Ok(v)
                } else {
                    Ok(b.chunks_exact(SIZE).map(|c| <$t>::from_le_bytes(c.try_into().expect("chunks of SIZE"))).collect())
                }
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
        T::put_all(self, out);
    }
    fn get(inp: &mut &[u8]) -> Result<Self, WireError> {
        let n = get_len(inp)?;
        T::get_all(n, inp)
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
        // A run of numbers one byte short, and a count whose bytes overflow.
        let mut short = encode(&vec![1u32, 2, 3]);
        short.pop();
        assert!(decode::<Vec<u32>>(&short).is_err());
        assert!(u64::get_all(usize::MAX, &mut &[0u8; 16][..]).is_err());
    }

    #[test]
    fn runs_of_numbers_are_their_bytes_in_order() {
        // The one-copy encoding of a Vec of numbers is the element by
        // element one: length, then each value little endian.
        let v = vec![0x0102u16, 0x0304, 0xfffe];
        assert_eq!(encode(&v), [3, 0, 0, 0, 2, 1, 4, 3, 0xfe, 0xff]);
        let bytes: Vec<u8> = (0..=255).collect();
        let mut want = vec![0, 1, 0, 0];
        want.extend_from_slice(&bytes);
        assert_eq!(encode(&bytes), want);
        // Nested and mixed sequences still go element by element.
        let nested = (vec![vec![1u8, 2], vec![], vec![3]], vec![(1u8, 2.5f64)], vec![-1i64, i64::MIN], vec![f32::NAN.to_bits()]);
        assert_eq!(decode::<(Vec<Vec<u8>>, Vec<(u8, f64)>, Vec<i64>, Vec<u32>)>(&encode(&nested)).unwrap(), nested);
    }
}
