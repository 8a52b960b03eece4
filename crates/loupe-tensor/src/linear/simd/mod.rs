//! SIMD pieces shared by the kernels of several layers (decode, GEMV, batch-invariant), one
//! file per ISA.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(test)]
mod tests;
