//! The process's one heap on musl: dlmalloc, for Rust's allocations and
//! for C's (`malloc` and the rest, which the bundled SQLite calls).
//!
//! musl's own malloc takes a global lock on every call and maps and unmaps
//! memory as its size-class groups fill and empty (84 mmaps and 65 munmaps
//! in one ADD with Rust's allocations on it; 39 and 31, thread stacks
//! included, with C's alone);
//! mimalloc gives each thread pages of its own per size class (430 page
//! faults an ADD against glibc's 200). dlmalloc grows one heap, as glibc's
//! malloc does with one arena (BENCHMARKS.md, "The allocator: one heap for Rust and C"). musl lets a
//! program replace `malloc`, `calloc`, `realloc` and `free` (they are weak
//! in its libc.a), and then calls them too; `aligned_alloc`,
//! `posix_memalign` and `memalign` are replaced with them so that every
//! pointer `free` may see comes from this heap.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard};

use dlmalloc::Dlmalloc;

/// The heap, behind a lock (std's `Mutex` is a futex: it never allocates).
struct Heap(Dlmalloc);

// SAFETY: the heap's raw pointers are only used under the lock.
unsafe impl Send for Heap {}

static HEAP: Mutex<Heap> = Mutex::new(Heap(Dlmalloc::new()));

fn heap() -> MutexGuard<'static, Heap> {
    // A panic never happens while the lock is held (dlmalloc does not
    // unwind), so a poisoned lock cannot occur; take it anyway.
    HEAP.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Rust's global allocator.
pub struct MuslHeap;

// SAFETY: every method forwards to dlmalloc under the lock, with the
// layout the caller allocated with.
unsafe impl GlobalAlloc for MuslHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { heap().0.malloc(layout.size(), layout.align()) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { heap().0.free(ptr, layout.size(), layout.align()) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe { heap().0.calloc(layout.size(), layout.align()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            heap()
                .0
                .realloc(ptr, layout.size(), layout.align(), new_size)
        }
    }
}

/// Sets this thread's errno.
fn set_errno(code: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = code };
}

/// A C allocation's answer: `ptr`, with errno set to ENOMEM when it is null.
fn or_enomem(ptr: *mut u8) -> *mut c_void {
    if ptr.is_null() {
        set_errno(libc::ENOMEM);
    }
    ptr.cast()
}

/// The alignment of every `malloc`: two words, as C requires.
const MALLOC_ALIGN: usize = 2 * std::mem::size_of::<usize>();

/// C's `malloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    // SAFETY: any size is accepted; the pointer is C's to free.
    or_enomem(unsafe { heap().0.c_malloc(size) })
}

/// C's `calloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    let Some(total) = count.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // SAFETY: dlmalloc's pointers from its layout API and its C API are
    // one heap's: `free` takes either. The memory comes back cleared.
    or_enomem(unsafe { heap().0.calloc(total, MALLOC_ALIGN) })
}

/// C's `realloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: a non-null `ptr` came from this heap (every allocation
    // function a C caller can reach is replaced here).
    or_enomem(unsafe { heap().0.c_realloc(ptr.cast(), size) })
}

/// C's `free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    // SAFETY: as realloc; null is a no-op.
    unsafe { heap().0.c_free(ptr.cast()) }
}

/// C's `aligned_alloc` (and `memalign`'s and `posix_memalign`'s work).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: `align` is a power of two.
    or_enomem(unsafe { heap().0.c_memalign(align, size) })
}

/// C's `memalign`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: as aligned_alloc.
    unsafe { aligned_alloc(align, size) }
}

/// C's `posix_memalign`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || align < std::mem::size_of::<*mut c_void>() {
        return libc::EINVAL;
    }
    // SAFETY: `align` is a power of two; `out` is the caller's.
    unsafe {
        let ptr = heap().0.c_memalign(align, size);
        if ptr.is_null() {
            return libc::ENOMEM;
        }
        *out = ptr.cast();
    }
    0
}
