//! Tables I and II of the TISSEC paper (Amir, Kim, Nita-Rotaru, Tsudik: "On
//! the performance of group key agreement protocols"), as formulas.
//!
//! n is the group size before the event, m the number of merging members, p
//! the number of leaving members. Entries the paper gives only as a
//! tree-shape-dependent bound (TGDH: h, 3h/2, 3h) or as an average (STR leave)
//! are `None` for exact comparison; the README discusses them.

use conclave_gka::ProtocolId;

use crate::scenario::Event;

/// One row of the paper's tables; `None` where the paper's count is not exact.
#[derive(Clone, Copy, Debug, Default)]
pub struct PaperRow {
    pub rounds: Option<u64>,
    pub unicasts: Option<u64>,
    pub broadcasts: Option<u64>,
    pub exps: Option<u64>,
    pub sigs: Option<u64>,
    pub verifs: Option<u64>,
}

fn row(r: u64, u: u64, b: u64, e: Option<u64>, s: u64, v: u64) -> PaperRow {
    PaperRow { rounds: Some(r), unicasts: Some(u), broadcasts: Some(b), exps: e, sigs: Some(s), verifs: Some(v) }
}

/// The paper's counts for one protocol and event.
pub fn counts(protocol: ProtocolId, event: Event, n: u64, m: u64, p: u64) -> PaperRow {
    use Event::*;
    use ProtocolId::*;
    match (protocol, event) {
        (Gdh, Join) => row(4, n + 1, 2, Some(n + 3), 4, n + 3),
        (Gdh, Leave) => row(1, 0, 1, Some(n - 1), 1, 1),
        (Gdh, Merge) => row(m + 3, n + 2 * m - 1, 2, Some(n + 2 * m + 1), m + 3, n + 2 * m + 1),
        (Gdh, Partition) => row(1, 0, 1, Some(n - p), 1, 1),
        (Tgdh, Join) | (Tgdh, Merge) => row(2, 0, 3, None, 2, 3),
        (Tgdh, Leave) => row(1, 0, 1, None, 1, 1),
        (Tgdh, Partition) => PaperRow { unicasts: Some(0), ..Default::default() },
        (Str, Join) => row(2, 0, 3, Some(7), 2, 3),
        (Str, Leave) | (Str, Partition) => row(1, 0, 1, None, 1, 1),
        (Str, Merge) => row(2, 0, 3, Some(3 * m + 4), 2, 3),
        (Bd, Join) => row(2, 0, 2 * n + 2, Some(3), 2, n + 3),
        (Bd, Leave) => row(2, 0, 2 * n - 2, Some(3), 2, n + 1),
        (Bd, Merge) => row(2, 0, 2 * n + 2 * m, Some(3), 2, n + m + 2),
        (Bd, Partition) => row(2, 0, 2 * n - 2 * p, Some(3), 2, n - p + 2),
        (Ckd, Join) => row(3, 1, 2, Some(n + 2), 3, 3),
        (Ckd, Leave) => row(1, 0, 1, Some(n - 2), 1, 1),
        (Ckd, Merge) => row(3, m, 2, Some(n + 2 * m), 3, m + 2),
        (Ckd, Partition) => row(1, 0, 1, Some(n - p - 1), 1, 1),
        // Table I's row is garbled in our copy of the paper; Table II gives
        // 2n-3 exponentiations, 2n-2 signatures and n verifications.
        (Ckd, ControllerLeave) => PaperRow {
            rounds: Some(3),
            exps: Some(2 * n - 3),
            sigs: Some(2 * n - 2),
            verifs: Some(n),
            ..Default::default()
        },
        (_, ControllerLeave) => PaperRow::default(),
    }
}
