//! Files a command writes besides stdout (`--html`, `--profile-out`): checked before any
//! work, so a typo in a path fails in a second, not after a model run.

use std::path::Path;

use crate::UsageError;

/// `path` can be created: its directory exists.
pub fn check_output_file(flag: &str, path: &Path) -> anyhow::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(UsageError(format!("{flag} {}: no directory {}", path.display(), dir.display())).into());
    }
    Ok(())
}

/// Writes the HTML report of a comparison and says where on stderr.
pub fn write_html(path: &Path, report: &loupe_parity::Report) -> anyhow::Result<()> {
    std::fs::write(path, loupe_parity::html::to_html(report))
        .map_err(|e| anyhow::anyhow!("--html {}: {e}", path.display()))?;
    eprintln!("loupe: wrote the HTML report to {}", path.display());
    Ok(())
}
