//! The panels' shared geometry: the weight formats they take, the packed record's and the
//! activation side table's layouts, and one packed panel with its activation rows.

use crate::quant::blocks::QK_K;
use crate::GgmlType;

pub(crate) use crate::linear::panel_tasks::PANEL;

/// Bytes of a Q4_K super-block (`d`, `dmin`, 12 bytes of scales, 128 of codes).
pub(crate) const Q4K_BYTES: usize = 144;

/// Bytes of a Q5_K super-block (`d`, `dmin`, 12 bytes of scales, 32 of high bits `qh`, 128
/// of low nibbles `qs`).
pub(crate) const Q5K_BYTES: usize = 176;

/// Bytes of a Q6_K super-block (`ql[128]`, `qh[64]`, 16 signed scales, `d`).
pub(crate) const Q6K_BYTES: usize = 210;

/// Bytes of a Q8_0 activation block (`d: f16, qs: [i8; 32]`).
pub(crate) const Q8_0_BYTES: usize = 34;

/// Offset in a packed super-block record of its codes (64 vectors); the sum groups' `ws`
/// and `wm` follow ([`Format::scales`], [`Format::mins`]).
pub(crate) const CODES: usize = 0;

/// Bytes per activation row and super-block of the side table: the 8 blocks' `d_a`, then
/// `s_a` of each sum group (at most 16) as f32.
pub(crate) const SIDE_BYTES: usize = 96;

/// A weight type the panels take: Q4_K or Q5_K (8 sum groups of 32 per super-block, each
/// with a scale and a min; Q5_K's codes have a fifth bit) or Q6_K (16 groups of 16, each a signed scale; the codes' bias of 32 is
/// the min term `wm = 32 ws`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Format {
    pub(crate) ty: GgmlType,
    /// Sum groups per super-block.
    pub(crate) groups: usize,
}

impl Format {
    pub(crate) fn of(ty: GgmlType) -> Option<Format> {
        match ty {
            GgmlType::Q4K | GgmlType::Q5K => Some(Format { ty, groups: 8 }),
            GgmlType::Q6K => Some(Format { ty, groups: 16 }),
            _ => None,
        }
    }

    /// Offset of the groups' `ws` vectors in a record.
    pub(crate) const fn scales(self) -> usize {
        64 * 64
    }

    /// Offset of the groups' `wm` vectors in a record.
    pub(crate) const fn mins(self) -> usize {
        self.scales() + self.groups * 64
    }

    /// Bytes of one packed super-block of a panel.
    pub(crate) const fn sb_bytes(self) -> usize {
        self.mins() + self.groups * 64
    }

    /// Elements per sum group.
    pub(crate) const fn group_len(self) -> usize {
        QK_K / self.groups
    }
}

/// One packed panel and the activation rows that stream past it.
pub(crate) struct Rows<'a> {
    pub(crate) fmt: Format,
    pub(crate) panel: &'a [u8],
    pub(crate) sbs: usize,
    pub(crate) act: &'a [u8],
    pub(crate) act_row: usize,
    pub(crate) side: &'a [u8],
    pub(crate) m: usize,
}
