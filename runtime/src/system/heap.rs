//! The process's own heap: what a shim keeps while its actor sleeps.
//!
//! A shim lives as long as its pod, and most of that time its actor is
//! suspended: every page its allocator keeps but does not use is host
//! memory paid per sleeping actor. glibc's malloc gives each thread that
//! allocates an arena of its own (up to 8 per core) and returns freed
//! memory to the kernel only at the top of the main heap; [`limit_arenas`]
//! and [`release_free`] undo both. Elsewhere (another C library) they do
//! nothing.

/// Caps glibc's malloc at `n` arenas (`M_ARENA_MAX`). Call it first in
/// `main`, before any thread starts. Returns whether the C library took it.
pub fn limit_arenas(n: i32) -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets an allocator parameter; before other
        // threads exist nothing allocates concurrently.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, n) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = n;
        false
    }
}

/// Gives the allocator's free pages back to the kernel (`malloc_trim`):
/// after a suspend is committed, what the shim kept for it is garbage.
pub fn release_free() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks and trims the allocator's own free
    // lists, under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_after_a_large_free_is_safe() {
        let v: Vec<u8> = vec![7; 8 << 20];
        assert_eq!(v[v.len() - 1], 7);
        drop(v);
        release_free();
        let w: Vec<u8> = vec![1; 4096];
        assert_eq!(w.iter().map(|&b| b as usize).sum::<usize>(), 4096);
    }
}
