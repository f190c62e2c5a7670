//! Handing freed memory back to the system after a large transient allocation.
//!
//! glibc's allocator keeps freed heap memory in the process for reuse. After a large list
//! (a 140 MB body arrives as thousands of small frames interleaved with the objects parsed
//! from them) the freed frames stay in RSS as holes between live objects, roughly doubling
//! a key's apparent cost for good. `malloc_trim` returns the whole free pages among them
//! (glibc walks every arena and `madvise`s them away); the objects stay where they are.

/// Bodies above this size are worth a trim afterwards (a trim walks the heap).
pub const TRIM_AFTER_BYTES: usize = 4 << 20;

/// Returns freed heap pages to the system; a no-op where the allocator is not glibc's.
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointers and only changes the allocator's own
        // bookkeeping; any thread may call it at any time.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
