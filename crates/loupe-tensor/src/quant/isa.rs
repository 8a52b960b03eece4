//! Which instruction-set level the quantized kernels run at.
//!
//! Detected once per process; `LOUPE_ISA=scalar|avx2|avx512|amx` lowers it (never
//! raises it past what the CPU has), to bisect a numeric difference to a SIMD path
//! or to run the scalar reference end to end.

use std::sync::OnceLock;

/// An instruction-set level, ordered: each level implies the ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust; the reference every SIMD kernel is tested against.
    Scalar,
    /// AVX2 + FMA + F16C (Haswell and later, Zen).
    Avx2,
    /// AVX-512 F/BW/VL + VNNI on top of `Avx2` (Ice Lake, Sapphire Rapids, Zen 4).
    Avx512,
    /// AMX-TILE + AMX-INT8 on top of `Avx512`, with the tile state granted by the OS
    /// (Sapphire Rapids and later): prefill of Q4_1 / Q8_0 / Q5_0 on tiles ([`crate::linear::amx`]);
    /// every other kernel runs its `Avx512` path.
    Amx,
}

impl Isa {
    /// All levels, lowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx];

    /// The `LOUPE_ISA` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    /// Parses a `LOUPE_ISA` value (case-insensitive).
    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The highest level this CPU supports (detected once).
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(detect)
    }

    /// The level kernels use: [`Isa::detected`], lowered by `LOUPE_ISA` if set.
    /// Read once; later changes to the environment have no effect.
    pub fn active() -> Isa {
        static ACTIVE: OnceLock<Isa> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let hw = Isa::detected();
            match std::env::var("LOUPE_ISA") {
                Err(_) => hw,
                Ok(v) => match Isa::parse(&v) {
                    Some(want) if want <= hw => want,
                    Some(want) => {
                        eprintln!("loupe: LOUPE_ISA={} is not supported by this CPU; using {}", want.name(), hw.name());
                        hw
                    }
                    None => {
                        eprintln!(
                            "loupe: LOUPE_ISA={v:?} is not one of scalar, avx2, avx512, amx; using {}",
                            hw.name()
                        );
                        hw
                    }
                },
            }
        })
    }

    /// Whether this CPU can run kernels of this level.
    pub fn is_supported(self) -> bool {
        self <= Isa::detected()
    }

    /// Every level this CPU supports, lowest first (what tests iterate over).
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_supported()).collect()
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    // VNNI is required, not just F/BW: the int8 kernels are built on vpdpbusd.
    let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni");
    if avx512 && tiles_usable() {
        Isa::Amx
    } else if avx512 {
        Isa::Avx512
    } else if avx2 {
        Isa::Avx2
    } else {
        Isa::Scalar
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::Scalar
}

/// Whether this CPU is AMD's (CPUID leaf 0's vendor string `AuthenticAMD`). Its AVX-512
/// cores (Zen 4) run 512-bit vectors on 256-bit units, which moves where one kernel
/// overtakes another ([`crate::linear::dispatch`]).
pub fn vendor_is_amd() -> bool {
    static AMD: OnceLock<bool> = OnceLock::new();
    *AMD.get_or_init(detect_amd)
}

#[cfg(target_arch = "x86_64")]
fn detect_amd() -> bool {
    // The vendor string is EBX, EDX, ECX of leaf 0 (AMD APM vol. 3, CPUID Fn0000_0000).
    let leaf0 = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    for (i, reg) in [leaf0.ebx, leaf0.edx, leaf0.ecx].into_iter().enumerate() {
        vendor[4 * i..4 * i + 4].copy_from_slice(&reg.to_le_bytes());
    }
    &vendor == b"AuthenticAMD"
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_amd() -> bool {
    false
}

/// Whether this CPU has AMX-TILE and AMX-INT8 and the OS granted this process the tile
/// state (asked once; later calls return the first answer).
pub fn tiles_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(request_tiles)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tiles() -> bool {
    // CPUID.(EAX=7, ECX=0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8 (Intel SDM vol. 2A, CPUID).
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    if leaf7.edx & (1 << 24) == 0 || leaf7.edx & (1 << 25) == 0 {
        return false;
    }
    // arch/x86/include/uapi/asm/prctl.h: ARCH_REQ_XCOMP_PERM = 0x1023; XFEATURE_XTILEDATA = 18.
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permitted
    // extended state; it reads and writes no memory of ours.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tiles() -> bool {
    false
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    /// CPUID's vendor against the kernel's reading of it.
    #[test]
    fn vendor_matches_proc_cpuinfo() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("reading /proc/cpuinfo");
        let vendor = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("vendor_id").map(|v| v.trim_start_matches([' ', '\t', ':']).trim()))
            .expect("/proc/cpuinfo has a vendor_id line");
        assert_eq!(super::vendor_is_amd(), vendor == "AuthenticAMD", "vendor_id {vendor}");
    }
}
