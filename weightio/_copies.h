/* weightio._speedups, part four (Linux): fresh destination pages made by the kernel already holding
   the file's bytes, never zeroed.

   A page of fresh anonymous memory is zeroed by the kernel when it is first faulted in (or
   populated), then overwritten by the read: on the VMs here, zeroing and backing the pages of a 4 GiB
   owned load cost more than reading the bytes. userfaultfd's UFFDIO_COPY (Linux 4.3+) allocates each
   missing page of a registered range and fills it with a copy of the source's bytes, and skips the
   zeroing: in C, 2 threads filling 4 GiB took 0.94-1.58 s that way against 1.74-1.91 s with
   MADV_POPULATE_WRITE + pread, right after the memory was last used, and 2.15-2.66 s against
   2.50-3.26 s once the VM's host had taken it back (docs/benchmarks.md "Memory").

   How it is used (`copy_pages`, for the whole pages of a piece of `read_pieces` called with
   `copies`): the file's stretch under the piece is mapped read-only (MAP_SHARED: its page-cache
   pages, asked for in one call, MADV_POPULATE_READ), the destination's whole pages are registered
   (MISSING mode), copied from that mapping, unregistered, and the stretch unmapped, all within the
   piece: the process keeps no mapping of the file's pages once the call returns (its RSS is the
   owned copy's, as with pread). What is not copied (the partial pages at a piece's ends, a page
   already present, any refusal) is read with pread by the caller, as before. The pages of a
   destination already there (memory used before) are found first (`mincore`): only those missing
   before the first of them are copied, and the file mapped for them alone (1 GiB into memory all
   there, 8 MiB pieces, one thread: 162-207 ms, median 176, against 185-266 ms, median 190, when the
   whole stretch was mapped for a copy that stopped at its first page; read without copies, 162-174
   ms). A destination that cannot be registered (not anonymous memory, a kernel without it, a
   seccomp filter that refuses userfaultfd: EPERM) costs a few system calls a piece (`mincore`, the
   mapping, the refused registration) and is read.

   Safety:
   - The descriptor is opened with UFFD_USER_MODE_ONLY (5.11+; allowed without privilege), by the
     call that uses it, and closed before the call returns: it never outlives the registration, is
     never used in a child after fork (the kernel ties a descriptor to the process that opened it),
     and its release unregisters anything left registered.
   - While a range is registered, a page of it that is missing makes a user-mode fault wait for the
     copy (or EFAULT in the kernel): only the destination's own whole pages are registered, which
     nothing else reads or writes until the fill returns, and unregistering wakes any such wait.
   - The source is a mapping of the call's own descriptor, exactly the piece's stretch. Where the
     file was truncated since the load began, a page of it wholly past the end fails the copy with
     EFAULT, read by the kernel, never a signal to the process; the page holding the end is read as
     zeros past it, so the bytes copied are cut at the file's size (fstat, after the copy). Either
     way the caller's pread from there then says where the file ended. Included by _reads.h. */

#if defined(__linux__)
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#endif

#if defined(__linux__) && defined(__NR_userfaultfd) && defined(UFFDIO_COPY)
#define KERNEL_COPIES 1
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1 /* linux/userfaultfd.h, 5.11+ */
#endif
/* A piece's whole pages are copied by the kernel only from this size: below it the system calls
   cost more than the zeroing they save (and the small pieces are read together by one preadv). */
#define COPY_MIN (256 * 1024)
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* linux/mman.h, 5.14+ (older kernels refuse it: the copy faults the pages) */
#endif

/* A userfaultfd descriptor for this call, or -1 where there is none to be had. */
static int open_copier(void) {
    int fd = (int)syscall(__NR_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
    if (fd < 0)
        return -1;
    struct uffdio_api api = {.api = UFFD_API, .features = 0};
    if (ioctl(fd, UFFDIO_API, &api) != 0 || !(api.ioctls & ((__u64)1 << _UFFDIO_REGISTER))) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The bytes of the whole pages [at, at + length) before the first of them that is there (all of
   them where the kernel will not say: the copy then stops at that page by itself). */
static size_t missing_pages(char *at, size_t length, uintptr_t page) {
    unsigned char there[4096]; /* (as many pages as the kernel looks at in one batch) */
    size_t pages = length / page;
    for (size_t k = 0; k < pages; k += sizeof there) {
        size_t n = pages - k < sizeof there ? pages - k : sizeof there;
        if (mincore(at + k * page, n * page, there) != 0)
            return length;
        for (size_t j = 0; j < n; j++)
            if (there[j] & 1)
                return (k + j) * page;
    }
    return length;
}

/* Copy the whole pages [at, at + length) of a destination from `fd`'s file at `offset`, through a
   read-only mapping of that stretch made for the call (so the process keeps no mapping of the file's
   pages once it returns) and a registration of the range for the copy. Returns the bytes copied from
   `at`: all of them, or fewer where a page is found there already (`missing_pages`; 0 where fewer
   than COPY_MIN bytes are missing before it), where the kernel stopped (a page present, a file page
   it could not read: the file ended; no memory; mapping or registration refused: 0) or where the
   file ends (then not a whole number of pages). The range is unregistered and the stretch unmapped
   before it returns, whatever happened. */
static Py_ssize_t copy_pages(int uffd, int fd, char *at, Py_ssize_t length, long long offset, uintptr_t page) {
    /* Memory used before (a model loaded again into the memory of the last one) has some or all of
       its pages: only the missing ones before the first that is there are copied, and the file's
       stretch mapped for them alone. */
    length = (Py_ssize_t)missing_pages(at, (size_t)length, page);
    if (length < COPY_MIN)
        return 0;
    long long start = offset / (long long)page * (long long)page;
    size_t skip = (size_t)(offset - start), span = skip + (size_t)length;
    char *file = mmap(NULL, span, PROT_READ, MAP_SHARED, fd, (off_t)start);
    if (file == MAP_FAILED)
        return 0;
    (void)madvise(file, span, MADV_POPULATE_READ); /* (a hint: the file's pages mapped in one call) */
    uintptr_t low = (uintptr_t)at, high = low + (uintptr_t)length, done = low;
    struct uffdio_register reg = {.range = {.start = low, .len = high - low}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) == 0) {
        while (done < high) {
            struct uffdio_copy copy = {.dst = done, .src = (uintptr_t)file + skip + (done - low), .len = high - done};
            int failed = ioctl(uffd, UFFDIO_COPY, &copy) != 0;
            if (copy.copy > 0)
                done += (uintptr_t)copy.copy;
            if (!failed || copy.copy <= 0) /* (EAGAIN with bytes copied: the rest is tried again) */
                break;
        }
    }
    /* Unregistered whatever REGISTER said: it can fail partway (no memory to split a mapping), leaving
       part of the range registered. (Refused: closing the descriptor unregisters it.) */
    struct uffdio_range range = {.start = low, .len = high - low};
    (void)ioctl(uffd, UFFDIO_UNREGISTER, &range);
    /* The page holding the file's end is read through the mapping as zeros past it: the copy is cut at
       the file's size (the caller's pread from there finds the end and says where the file ended). */
    struct stat st;
    if (done > low && fstat(fd, &st) == 0 && (long long)st.st_size < offset + (long long)(done - low))
        done = low + (st.st_size > offset ? (uintptr_t)(st.st_size - offset) : 0);
    munmap(file, span);
    return (Py_ssize_t)(done - low);
}
#endif

PyDoc_STRVAR(kernel_copies_doc,
"kernel_copies()\n--\n\n"
"True where read_pieces(..., copies=True) has the whole fresh pages of its pieces made by the kernel\n"
"(userfaultfd's UFFDIO_COPY: Linux 5.11+, not refused by a seccomp filter or a security module):\n"
"a descriptor is opened and closed to find out.");

static PyObject *kernel_copies(PyObject *module, PyObject *unused) {
#ifdef KERNEL_COPIES
    int fd = open_copier();
    if (fd >= 0) {
        close(fd);
        Py_RETURN_TRUE;
    }
#endif
    Py_RETURN_FALSE;
}
