//! Errors of the Rust API, mirroring `VIP_RETURN`: every error carries the
//! `VIP_*` code a C caller would get and a message naming the cause.

use std::borrow::Cow;
use std::fmt;
use via_kernel_agent::memory::MemError;

/// `VIP_RETURN` codes, in their ABI order (`VIP_SUCCESS` = 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum VipReturn {
    Success = 0,
    NotDone = 1,
    InvalidParameter = 2,
    ErrorResource = 3,
    Timeout = 4,
    Reject = 5,
    InvalidReliabilityLevel = 6,
    InvalidMtu = 7,
    InvalidQos = 8,
    InvalidPtag = 9,
    InvalidRdmaRead = 10,
    DescriptorError = 11,
    InvalidState = 12,
    ErrorNameService = 13,
    NoMatch = 14,
}

impl VipReturn {
    /// The C name, e.g. `VIP_NO_MATCH`.
    pub fn name(self) -> &'static str {
        match self {
            VipReturn::Success => "VIP_SUCCESS",
            VipReturn::NotDone => "VIP_NOT_DONE",
            VipReturn::InvalidParameter => "VIP_INVALID_PARAMETER",
            VipReturn::ErrorResource => "VIP_ERROR_RESOURCE",
            VipReturn::Timeout => "VIP_TIMEOUT",
            VipReturn::Reject => "VIP_REJECT",
            VipReturn::InvalidReliabilityLevel => "VIP_INVALID_RELIABILITY_LEVEL",
            VipReturn::InvalidMtu => "VIP_INVALID_MTU",
            VipReturn::InvalidQos => "VIP_INVALID_QOS",
            VipReturn::InvalidPtag => "VIP_INVALID_PTAG",
            VipReturn::InvalidRdmaRead => "VIP_INVALID_RDMAREAD",
            VipReturn::DescriptorError => "VIP_DESCRIPTOR_ERROR",
            VipReturn::InvalidState => "VIP_INVALID_STATE",
            VipReturn::ErrorNameService => "VIP_ERROR_NAMESERVICE",
            VipReturn::NoMatch => "VIP_NO_MATCH",
        }
    }
}

/// An error of a VIPL operation. The message is static text where the
/// cause needs no numbers, so that the errors a polling program meets all
/// the time (`VIP_NOT_DONE`) allocate nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViaError {
    pub code: VipReturn,
    pub message: Cow<'static, str>,
}

impl ViaError {
    pub fn new(code: VipReturn, message: impl Into<Cow<'static, str>>) -> Self {
        ViaError { code, message: message.into() }
    }
    pub fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(VipReturn::InvalidParameter, message)
    }
    pub fn state(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(VipReturn::InvalidState, message)
    }
    pub fn resource(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(VipReturn::ErrorResource, message)
    }
    pub fn timeout(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(VipReturn::Timeout, message)
    }
    /// `VIP_NOT_DONE`, allocating nothing.
    pub const fn not_done() -> Self {
        ViaError { code: VipReturn::NotDone, message: Cow::Borrowed("nothing completed yet") }
    }
    pub fn io(context: &str, e: std::io::Error) -> Self {
        Self::resource(format!("{context}: {e}"))
    }
}

impl fmt::Display for ViaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

impl std::error::Error for ViaError {}

impl From<MemError> for ViaError {
    fn from(e: MemError) -> Self {
        let code = match e {
            MemError::BadPtag | MemError::PtagMismatch => VipReturn::InvalidPtag,
            MemError::TooManyRegions => VipReturn::ErrorResource,
            MemError::PtagInUse => VipReturn::InvalidState,
            _ => VipReturn::InvalidParameter,
        };
        ViaError::new(code, e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, ViaError>;
