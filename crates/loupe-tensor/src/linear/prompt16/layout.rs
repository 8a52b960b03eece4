//! The panels' shared geometry: the packed record's layout, and one packed panel with its
//! activation rows.

use crate::GgmlType;

pub(crate) use crate::linear::panel_tasks::PANEL;

/// Bytes of one packed block of a panel: 16 code vectors, `d`, `m`.
pub(crate) const RECORD_BYTES: usize = 18 * 64;

/// Offsets in a record of the rows' `d` and `m` vectors.
pub(crate) const D: usize = 16 * 64;
pub(crate) const M: usize = 17 * 64;

/// One packed panel and the activation rows that stream past it.
pub(crate) struct Rows<'a> {
    pub(crate) ty: GgmlType,
    pub(crate) panel: &'a [u8],
    pub(crate) blocks: usize,
    pub(crate) q: &'a [i16],
    pub(crate) scale_sum: &'a [f32],
    pub(crate) m: usize,
}
