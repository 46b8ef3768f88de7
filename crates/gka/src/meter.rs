//! The cost meter: what a member spent on one membership event.
//!
//! Every engine counts its own operations as it performs them: full-size
//! exponentiations (scalar multiplications), BD's small-exponent ones apart,
//! signatures, verifications, messages sent and bytes sent. The benchmark and
//! the tests read these counters; Tables I and II of the TISSEC paper are the
//! reference they are checked against.

use std::ops::{Add, AddAssign, Sub};

/// Operation counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Costs {
    /// Full-size exponentiations (g^x, y^x).
    pub exps: u64,
    /// Exponentiations with small exponents (BD step 3).
    pub small_exps: u64,
    /// Signatures generated.
    pub sigs: u64,
    /// Signatures verified.
    pub verifs: u64,
    /// Unicast messages sent.
    pub unicasts: u64,
    /// Broadcast messages sent.
    pub broadcasts: u64,
    /// Bytes sent (whole signed messages; a broadcast counts once).
    pub bytes: u64,
}

impl Costs {
    /// The counters as a fixed list, in field order (for element-wise maxima).
    pub fn to_array(self) -> [u64; 7] {
        [self.exps, self.small_exps, self.sigs, self.verifs, self.unicasts, self.broadcasts, self.bytes]
    }

    /// The inverse of [`Costs::to_array`].
    pub fn from_array(a: [u64; 7]) -> Self {
        Self {
            exps: a[0],
            small_exps: a[1],
            sigs: a[2],
            verifs: a[3],
            unicasts: a[4],
            broadcasts: a[5],
            bytes: a[6],
        }
    }

    /// Element-wise maximum.
    pub fn max(self, other: Self) -> Self {
        let (a, b) = (self.to_array(), other.to_array());
        Self::from_array(std::array::from_fn(|i| a[i].max(b[i])))
    }
}

impl Add for Costs {
    type Output = Costs;
    fn add(self, o: Costs) -> Costs {
        let (a, b) = (self.to_array(), o.to_array());
        Costs::from_array(std::array::from_fn(|i| a[i] + b[i]))
    }
}

impl AddAssign for Costs {
    fn add_assign(&mut self, o: Costs) {
        *self = *self + o;
    }
}

impl Sub for Costs {
    type Output = Costs;
    fn sub(self, o: Costs) -> Costs {
        let (a, b) = (self.to_array(), o.to_array());
        Costs::from_array(std::array::from_fn(|i| a[i].saturating_sub(b[i])))
    }
}
