//! Return codes, the thread's last error message, and the guard every
//! exported function runs in (no panic crosses the boundary).

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a call returns. `CONCLAVE_OK` (0) is success, `CONCLAVE_TIMEOUT`
/// (1) says that `conclave_recv` found no event in time (not a failure);
/// every failure is negative, and `conclave_last_error()` then describes it.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum conclave_status_t {
    /// Success.
    CONCLAVE_OK = 0,
    /// `conclave_recv`: no event within the timeout (not an error).
    CONCLAVE_TIMEOUT = 1,
    /// A pointer argument that must not be NULL was NULL.
    CONCLAVE_ERR_NULL = -1,
    /// A string argument is not valid UTF-8.
    CONCLAVE_ERR_UTF8 = -2,
    /// An argument is invalid: a bad member or group name, a bad endpoint,
    /// a message length that is not addressable; a call from inside a tokio
    /// runtime (Rust callers only).
    CONCLAVE_ERR_INVALID = -3,
    /// The policy string names no policy this library knows.
    CONCLAVE_ERR_POLICY = -4,
    /// The daemon could not be reached, or refused the connection (for
    /// example: the member name is taken).
    CONCLAVE_ERR_CONNECT = -5,
    /// The identity or the authority could not be loaded from the key
    /// directory (missing, unreadable, malformed, not this member's, or a
    /// secret key that others may read).
    CONCLAVE_ERR_IDENTITY = -6,
    /// `conclave_join`: this handle is already a member of the group.
    CONCLAVE_ERR_ALREADY_JOINED = -7,
    /// The handle is not a member of the group.
    CONCLAVE_ERR_NOT_JOINED = -8,
    /// `conclave_join`: the handle is still leaving the group; join again
    /// after its `CONCLAVE_EVENT_LEFT` event.
    CONCLAVE_ERR_STILL_LEAVING = -9,
    /// `conclave_read_membership`: joined, but no secure view (no key) yet.
    CONCLAVE_ERR_NO_VIEW = -10,
    /// `conclave_send`: the message is larger than the session allows.
    CONCLAVE_ERR_TOO_LARGE = -11,
    /// The connection to the daemon is gone; the handle can only be destroyed.
    CONCLAVE_ERR_CLOSED = -12,
    /// The policy asks for something this version cannot do.
    CONCLAVE_ERR_UNSUPPORTED = -13,
    /// An internal error (a bug): the library caught a panic or could not
    /// start its runtime. The handle should be destroyed.
    CONCLAVE_ERR_INTERNAL = -99,
}

pub use conclave_status_t::*;

/// A failure: its code and a message for people (never a secret).
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: conclave_status_t,
    pub(crate) message: String,
}

pub(crate) type Result<T> = std::result::Result<T, Failure>;

pub(crate) fn fail(code: conclave_status_t, message: impl Into<String>) -> Failure {
    Failure { code, message: message.into() }
}

impl From<conclave_secure::SessionError> for Failure {
    fn from(e: conclave_secure::SessionError) -> Failure {
        use conclave_secure::SessionError as E;
        let code = match &e {
            E::Client(_) | E::Closed => CONCLAVE_ERR_CLOSED,
            E::Name(_) => CONCLAVE_ERR_INVALID,
            E::NotJoined(_) => CONCLAVE_ERR_NOT_JOINED,
            E::AlreadyJoined(_) => CONCLAVE_ERR_ALREADY_JOINED,
            E::StillLeaving(_) => CONCLAVE_ERR_STILL_LEAVING,
            E::Unsupported(_) => CONCLAVE_ERR_UNSUPPORTED,
            E::TooLarge { .. } => CONCLAVE_ERR_TOO_LARGE,
        };
        fail(code, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Makes `message` this thread's last error (NUL bytes, which a message
/// never should hold, become `?`).
pub(crate) fn set_last_error(message: &str) {
    let c = cstring(message);
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// A C string of `s`, with any NUL byte replaced by `?`.
pub(crate) fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "?")).unwrap_or_default()
}

/// The thread's last error message; valid until the next failing call on
/// this thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

const PANIC_MESSAGE: &str = "internal error: the conclave library panicked (a bug; please report it); \
                             destroy this handle";

/// Runs an exported call: catches any panic, and turns a failure into its
/// code with its message stored as the thread's last error.
pub(crate) fn guard(f: impl FnOnce() -> Result<conclave_status_t>) -> conclave_status_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.code
        }
        Err(_) => {
            set_last_error(PANIC_MESSAGE);
            CONCLAVE_ERR_INTERNAL
        }
    }
}

/// Runs an exported accessor that cannot fail except by a NULL argument:
/// catches any panic and gives `default` instead.
pub(crate) fn guard_value<T>(default: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_last_error(PANIC_MESSAGE);
        default
    })
}

/// A string argument: not NULL, valid UTF-8.
///
/// # Safety
/// `p`, if not NULL, must point to a NUL-terminated string that stays valid
/// for `'a`.
pub(crate) unsafe fn arg_str<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(fail(CONCLAVE_ERR_NULL, format!("{what} is NULL")));
    }
    // SAFETY: not NULL; the caller promises a NUL-terminated string.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|e| fail(CONCLAVE_ERR_UTF8, format!("{what} is not valid UTF-8 ({e})")))
}

/// An optional string argument: NULL is `None`, otherwise valid UTF-8.
///
/// # Safety
/// As [`arg_str`].
pub(crate) unsafe fn arg_opt_str<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: the caller's promise, passed on.
        unsafe { arg_str(p, what) }.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_internal_error_with_a_message() {
        // Quiet the default hook's report of the panic this test provokes.
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let code = guard(|| panic!("provoked"));
        let value = guard_value(7, || -> i32 { panic!("provoked") });
        std::panic::set_hook(hook);
        assert_eq!(code, CONCLAVE_ERR_INTERNAL);
        assert_eq!(value, 7);
        // SAFETY: the thread's last error, a NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap();
        assert!(msg.contains("panicked") && !msg.contains("provoked"), "{msg}");
    }

    #[test]
    fn failures_keep_their_code_and_message() {
        assert_eq!(guard(|| Err(fail(CONCLAVE_ERR_POLICY, "no such\0policy"))), CONCLAVE_ERR_POLICY);
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap();
        assert_eq!(msg, "no such?policy");
        assert_eq!(guard(|| Ok(CONCLAVE_OK)), CONCLAVE_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap(), "no such?policy");
    }
}
