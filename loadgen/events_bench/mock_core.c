/* The native mocks' shared loop and account (mock_core.h). */
#define _GNU_SOURCE
#include "mock_core.h"

#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define LATE_BUCKETS 100000 /* 1 us each: lateness to 100 ms, past that in the last */

int64_t ttft_ns = 50000000, itl_ns = 10000000;
uint64_t requests;

static Due *heap;
static size_t heap_len, heap_cap;
static volatile sig_atomic_t stopping;
static uint64_t late_hist[LATE_BUCKETS + 1], events;
static double itl_n, itl_mean, itl_m2; /* Welford */

static int64_t ns_of(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int64_t now_ns(void) { return ns_of(CLOCK_MONOTONIC); }

/* SO_TIMESTAMPNS gives a CLOCK_REALTIME time, brought here to CLOCK_MONOTONIC: a request's
 * arrival is then when it reached the machine, not when this process got round to it. */
ssize_t read_stamped(int fd, char *buf, size_t len, int64_t *at_ns) {
    char control[CMSG_SPACE(sizeof(struct timespec))];
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                       .msg_controllen = sizeof control};
    ssize_t n = recvmsg(fd, &m, 0);
    for (struct cmsghdr *h = n > 0 ? CMSG_FIRSTHDR(&m) : NULL; h; h = CMSG_NXTHDR(&m, h)) {
        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec t;
            memcpy(&t, CMSG_DATA(h), sizeof t);
            int64_t real = (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
            int64_t mono = now_ns(), at = real - (ns_of(CLOCK_REALTIME) - mono);
            if (real && at <= mono) *at_ns = at;
        }
    }
    return n;
}

void push_due(int64_t due_ns, int key) {
    if (heap_len == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = realloc(heap, heap_cap * sizeof *heap);
    }
    size_t i = heap_len++;
    while (i && heap[(i - 1) / 2].due_ns > due_ns) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = (Due){due_ns, key};
}

static Due pop_due(void) {
    Due top = heap[0], last = heap[--heap_len];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= heap_len) break;
        if (c + 1 < heap_len && heap[c + 1].due_ns < heap[c].due_ns) c++;
        if (heap[c].due_ns >= last.due_ns) break;
        heap[i] = heap[c];
        i = c;
    }
    if (heap_len) heap[i] = last;
    return top;
}

void out_queue(OutBuf *o, const void *data, size_t len) {
    if (o->len + len > o->cap) {
        o->cap = (o->len + len) * 2;
        o->data = realloc(o->data, o->cap);
    }
    memcpy(o->data + o->len, data, len);
    o->len += len;
}

int out_flush(int ep, int fd, OutBuf *o) {
    size_t done = 0;
    while (done < o->len) {
        ssize_t n = write(fd, o->data + done, o->len - done);
        if (n < 0) {
            if (errno == EAGAIN) break;
            return -1;
        }
        done += (size_t)n;
    }
    memmove(o->data, o->data + done, o->len - done);
    o->len -= done;
    if (!o->len != !o->armed) {
        o->armed = o->len > 0;
        struct epoll_event ev = {.events = EPOLLIN | (o->armed ? EPOLLOUT : 0), .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    }
    return 0;
}

void account_event(int64_t at_ns, int64_t due_ns, int64_t last_ns) {
    int64_t late = (at_ns - due_ns) / 1000;
    late_hist[late < 0 ? 0 : late > LATE_BUCKETS ? LATE_BUCKETS : late]++;
    events++;
    if (last_ns) {
        double gap = (double)(at_ns - last_ns) / 1000.0, d = gap - itl_mean;
        itl_n += 1;
        itl_mean += d / itl_n;
        itl_m2 += d * (gap - itl_mean);
    }
}

static int64_t late_quantile(double q) {
    uint64_t total = 0, seen = 0;
    for (int i = 0; i <= LATE_BUCKETS; i++) total += late_hist[i];
    for (int i = 0; i <= LATE_BUCKETS; i++)
        if ((seen += late_hist[i]) > 0 && seen >= q * (double)total) return i;
    return 0;
}

/* requests, events, lateness p50/p99/max in us, the mean and standard deviation of the gaps put
 * between a stream's events (the truth's ITL), the CPU it used. */
static void write_stats(const char *path) {
    FILE *f = path ? fopen(path, "w") : stderr;
    if (!f) return;
    int64_t most = 0;
    for (int i = 0; i <= LATE_BUCKETS; i++)
        if (late_hist[i]) most = i;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
                 ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
    fprintf(f, "{\"requests\": %llu, \"events\": %llu, \"late_us\": {\"p50\": %lld, "
            "\"p99\": %lld, \"max\": %lld}, \"itl_us\": {\"mean\": %.3f, \"sd\": %.3f}, "
            "\"cpu_s\": %.3f}\n", (unsigned long long)requests, (unsigned long long)events,
            (long long)late_quantile(0.5), (long long)late_quantile(0.99), (long long)most,
            itl_mean, itl_n > 1 ? sqrt(itl_m2 / (itl_n - 1)) : 0.0, cpu);
    if (path) fclose(f);
}

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

static int listen_on(const char *name, int port, const char *port_file) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 4096) ||
        getsockname(s, (struct sockaddr *)&a, &len)) {
        fprintf(stderr, "%s: listen: %s\n", name, strerror(errno));
        exit(1);
    }
    if (port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", ntohs(a.sin_port)) < 0 || fclose(f) || rename(tmp, port_file)) {
            fprintf(stderr, "%s: port file: %s\n", name, strerror(errno));
            exit(1);
        }
    }
    return s;
}

static void accept_all(int ep, int s, const MockHandlers *h) {
    int fd, one = 1;
    while ((fd = accept4(s, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
        if (fd >= MAX_FD) {
            close(fd);
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
        h->accepted(ep, fd);
    }
}

/* Hands over every event due by now; arms the timer for the next. */
static void fire_due(int ep, int timer, const MockHandlers *h) {
    int64_t t = now_ns();
    while (heap_len && heap[0].due_ns <= t) {
        h->due(ep, pop_due());
        t = now_ns();
    }
    struct itimerspec at = {0};
    if (heap_len) {
        at.it_value.tv_sec = heap[0].due_ns / 1000000000;
        at.it_value.tv_nsec = heap[0].due_ns % 1000000000;
    }
    timerfd_settime(timer, TFD_TIMER_ABSTIME, &at, NULL);
}

static const char *parse_options(int argc, char **argv, const char *name, int *port,
                                 const char **port_file) {
    const char *stats = NULL;
    for (int i = 1; i < argc; i += 2) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!value) {
            fprintf(stderr, "%s: %s needs a value\n", name, argv[i]);
            exit(2);
        }
        if (!strcmp(argv[i], "--port")) *port = atoi(value);
        else if (!strcmp(argv[i], "--port-file")) *port_file = value;
        else if (!strcmp(argv[i], "--ttft-ms")) ttft_ns = (int64_t)(atof(value) * 1e6);
        else if (!strcmp(argv[i], "--itl-ms")) itl_ns = (int64_t)(atof(value) * 1e6);
        else if (!strcmp(argv[i], "--stats")) stats = value;
        else {
            fprintf(stderr, "%s: unknown option %s\n", name, argv[i]);
            exit(2);
        }
    }
    return stats;
}

int mock_main(int argc, char **argv, const MockHandlers *h) {
    int port = 0;
    const char *port_file = NULL, *stats = parse_options(argc, argv, h->name, &port, &port_file);
    struct rlimit nofile = {MAX_FD, MAX_FD};
    if (setrlimit(RLIMIT_NOFILE, &nofile)) {
        getrlimit(RLIMIT_NOFILE, &nofile);
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    prctl(PR_SET_TIMERSLACK, 1UL); /* timers on time to the microsecond, not 50 us late */
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int s = listen_on(h->name, port, port_file), ep = epoll_create1(0);
    int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s};
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    ev.data.fd = timer;
    epoll_ctl(ep, EPOLL_CTL_ADD, timer, &ev);
    struct epoll_event ready[256];
    while (!stopping) {
        int n = epoll_wait(ep, ready, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = ready[i].data.fd;
            if (fd == s) {
                accept_all(ep, s, h);
            } else if (fd == timer) {
                uint64_t expired;
                ssize_t got = read(timer, &expired, sizeof expired);
                (void)got;
            } else {
                if (ready[i].events & EPOLLOUT) h->writable(ep, fd);
                if (ready[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) h->readable(ep, fd);
            }
        }
        fire_due(ep, timer, h);
    }
    write_stats(stats);
    return 0;
}
