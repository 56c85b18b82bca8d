/* sse_mock: an OpenAI-compatible streaming mock with known delays, fast enough to measure a
 * load generator at 100k stream events/s on one core (make bench-loadgen, docs/measured.md).
 *
 * One thread, epoll, a timerfd and a heap of due events. POST (any path) answers with an event
 * stream in vLLM's /v1/completions shape: max_tokens events of one token each (token_ids where
 * the request asks return_token_ids), the first --ttft-ms after the request's body arrived (when
 * the kernel received it: the mock's own delay in reading it is its lateness), then one every
 * --itl-ms; then a usage event and [DONE]. GET /v1/models names one model owned by
 * "vllm". Each event carries server_elapsed_us (its write time from the request's arrival), the
 * usage its ttft_us: the truth a client's timestamps are checked against. Connections are kept
 * alive. Times are CLOCK_MONOTONIC.
 *
 * On SIGTERM or SIGINT it writes its own account to --stats as JSON and exits: requests,
 * events, its lateness (write time past the event's due time) p50/p99/max in us, and the mean
 * and standard deviation of the gaps it put between a stream's events (the truth's ITL).
 *
 *   sse_mock --port 0 --port-file F --ttft-ms 50 --itl-ms 10 --stats S
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 65536
#define IN_CAP 65536
#define ID_CAP 128
#define LATE_BUCKETS 100000 /* 1 us each: lateness to 100 ms, past that in the last */

typedef struct {
    int open, streaming;
    char in[IN_CAP];
    size_t in_len;
    char *out;
    size_t out_len, out_cap;
    char id[ID_CAP];
    int ids, left, sent, prompt;
    int64_t arrived_ns, last_ns, first_ns, due_ns;
    int64_t in_ns; /* when the kernel received the bytes last read (0: not known) */
} Conn;

typedef struct {
    int64_t due_ns;
    int fd;
} Due;

static Conn *conns;
static Due *heap;
static size_t heap_len, heap_cap;
static int64_t ttft_ns = 50000000, itl_ns = 10000000;
static volatile sig_atomic_t stopping;
static uint64_t late_hist[LATE_BUCKETS + 1], events, requests;
static double itl_n, itl_mean, itl_m2; /* Welford */

static int64_t ns_of(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t now_ns(void) { return ns_of(CLOCK_MONOTONIC); }

/* One read of fd into buf, and when the kernel received its last bytes (SO_TIMESTAMPNS, a
 * CLOCK_REALTIME time, brought to CLOCK_MONOTONIC) into *at_ns where it says: a request's
 * arrival is then when it reached the machine, not when this process got round to it. */
static ssize_t read_stamped(int fd, char *buf, size_t len, int64_t *at_ns) {
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

static void push(int64_t due_ns, int fd) {
    if (heap_len == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = realloc(heap, heap_cap * sizeof *heap);
    }
    size_t i = heap_len++;
    while (i && heap[(i - 1) / 2].due_ns > due_ns) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = (Due){due_ns, fd};
}

static Due pop(void) {
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

static void close_conn(int ep, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    Conn *c = &conns[fd];
    free(c->out);
    memset(c, 0, sizeof *c);
}

/* Writes what is queued; what the socket does not take waits for EPOLLOUT. */
static void flush_out(int ep, int fd) {
    Conn *c = &conns[fd];
    size_t done = 0;
    while (done < c->out_len) {
        ssize_t n = write(fd, c->out + done, c->out_len - done);
        if (n < 0) {
            if (errno == EAGAIN) break;
            close_conn(ep, fd);
            return;
        }
        done += (size_t)n;
    }
    memmove(c->out, c->out + done, c->out_len - done);
    c->out_len -= done;
    struct epoll_event ev = {.events = EPOLLIN | (c->out_len ? EPOLLOUT : 0), .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

static void queue_out(Conn *c, const char *data, size_t len) {
    if (c->out_len + len > c->out_cap) {
        c->out_cap = (c->out_len + len) * 2;
        c->out = realloc(c->out, c->out_cap);
    }
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
}

/* One server-sent event as one HTTP chunk. */
static void queue_event(Conn *c, const char *json, int len) {
    char head[32];
    int h = snprintf(head, sizeof head, "%x\r\ndata: ", len + 8);
    queue_out(c, head, (size_t)h);
    queue_out(c, json, (size_t)len);
    queue_out(c, "\n\n\r\n", 4);
}

static void write_event(int ep, int fd, int64_t due_ns) {
    Conn *c = &conns[fd];
    int64_t t = now_ns(), late = (t - due_ns) / 1000;
    late_hist[late < 0 ? 0 : late > LATE_BUCKETS ? LATE_BUCKETS : late]++;
    events++;
    if (c->sent) {
        double gap = (double)(t - c->last_ns) / 1000.0, d = gap - itl_mean;
        itl_n += 1;
        itl_mean += d / itl_n;
        itl_m2 += d * (gap - itl_mean);
    } else {
        c->first_ns = t;
    }
    c->last_ns = t;
    c->sent++;
    c->left--;
    char json[512];
    int n = snprintf(json, sizeof json,
                     "{\"id\":\"cmpl-%s\",\"object\":\"text_completion\",\"created\":0,"
                     "\"model\":\"mock\",\"choices\":[{\"index\":0,\"text\":\"a\"%s,"
                     "\"logprobs\":null,\"finish_reason\":%s,\"stop_reason\":null}],"
                     "\"usage\":null,\"server_elapsed_us\":%lld}",
                     c->id, c->ids ? ",\"token_ids\":[97]" : "", c->left ? "null" : "\"length\"",
                     (long long)((t - c->arrived_ns) / 1000));
    queue_event(c, json, n);
    if (!c->left) {
        n = snprintf(json, sizeof json,
                     "{\"id\":\"cmpl-%s\",\"object\":\"text_completion\",\"created\":0,"
                     "\"model\":\"mock\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,"
                     "\"completion_tokens\":%d,\"ttft_us\":%lld}}",
                     c->id, c->prompt, c->sent, (long long)((c->first_ns - c->arrived_ns) / 1000));
        queue_event(c, json, n);
        queue_event(c, "[DONE]", 6);
        queue_out(c, "0\r\n\r\n", 5);
        c->streaming = 0;
    } else {
        c->due_ns = due_ns + itl_ns;
        push(c->due_ns, fd);
    }
    flush_out(ep, fd);
}

/* The value of a JSON integer field in body, or fallback. */
static long json_int(const char *body, const char *key, long fallback) {
    const char *p = strstr(body, key);
    if (!p) return fallback;
    p += strlen(key);
    while (*p == ' ' || *p == ':') p++;
    return strtol(p, NULL, 10);
}

static void header_value(const char *head, const char *name, char *out, size_t cap) {
    out[0] = 0;
    for (const char *p = strcasestr(head, name); p; p = strcasestr(p + 1, name)) {
        if (p[-1] != '\n') continue;
        p += strlen(name);
        while (*p == ' ') p++;
        size_t n = strcspn(p, "\r\n\"\\");
        n = n < cap - 1 ? n : cap - 1;
        memcpy(out, p, n);
        out[n] = 0;
        return;
    }
}

/* A whole request in c->in: answers it; returns its length, 0 while it is not whole. */
static size_t answer(int ep, int fd) {
    Conn *c = &conns[fd];
    c->in[c->in_len] = 0;
    char *end = strstr(c->in, "\r\n\r\n");
    if (!end) return 0;
    size_t head_len = (size_t)(end - c->in) + 4;
    *end = 0;
    long body_len = json_int(c->in, "\nContent-Length", 0);
    if (body_len < 0 || head_len + (size_t)body_len > c->in_len) {
        *end = '\r';
        return 0;
    }
    char *body = c->in + head_len;
    char saved = body[body_len];
    body[body_len] = 0;
    if (!strncmp(c->in, "GET ", 4)) {
        static const char models[] =
            "{\"object\":\"list\",\"data\":[{\"id\":\"mock\",\"object\":\"model\","
            "\"owned_by\":\"vllm\"}]}";
        char head[160];
        int h = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: application/json"
                         "\r\nContent-Length: %zu\r\n\r\n", sizeof models - 1);
        queue_out(c, head, (size_t)h);
        queue_out(c, models, sizeof models - 1);
    } else {
        static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n";
        queue_out(c, head, sizeof head - 1);
        header_value(c->in, "X-Request-Id:", c->id, sizeof c->id);
        c->ids = strstr(body, "\"return_token_ids\": true") != NULL;
        c->left = (int)json_int(body, "\"max_tokens\"", 16);
        c->left = c->left > 0 ? c->left : 1;
        c->prompt = 0;
        c->sent = 0;
        c->streaming = 1;
        c->arrived_ns = c->in_ns ? c->in_ns : now_ns();
        c->in_ns = 0;
        c->due_ns = c->arrived_ns + ttft_ns;
        push(c->due_ns, fd);
        requests++;
    }
    body[body_len] = saved;
    flush_out(ep, fd);
    return head_len + (size_t)body_len;
}

static void on_readable(int ep, int fd) {
    Conn *c = &conns[fd];
    for (;;) {
        if (c->in_len >= IN_CAP - 1) { /* a request larger than the mock reads */
            close_conn(ep, fd);
            return;
        }
        ssize_t n = read_stamped(fd, c->in + c->in_len, IN_CAP - 1 - c->in_len, &c->in_ns);
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            close_conn(ep, fd);
            return;
        }
        if (n < 0) break;
        c->in_len += (size_t)n;
    }
    size_t used;
    while (c->open && !c->streaming && (used = answer(ep, fd))) {
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
    }
}

static int64_t late_quantile(double q) {
    uint64_t total = 0, seen = 0;
    for (int i = 0; i <= LATE_BUCKETS; i++) total += late_hist[i];
    for (int i = 0; i <= LATE_BUCKETS; i++)
        if ((seen += late_hist[i]) > 0 && seen >= q * (double)total) return i;
    return 0;
}

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

static int listen_on(int port, const char *port_file) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 4096) ||
        getsockname(s, (struct sockaddr *)&a, &len)) {
        perror("sse_mock: listen");
        exit(1);
    }
    if (port_file) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", ntohs(a.sin_port)) < 0 || fclose(f) || rename(tmp, port_file)) {
            perror("sse_mock: port file");
            exit(1);
        }
    }
    return s;
}

static void accept_all(int ep, int s) {
    int fd, one = 1;
    while ((fd = accept4(s, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
        if (fd >= MAX_FD) {
            close(fd);
            continue;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
        conns[fd].open = 1;
        conns[fd].in_ns = 0;
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

/* Writes every event due by now; arms the timer for the next. */
static void fire_due(int ep, int timer) {
    int64_t t = now_ns();
    while (heap_len && heap[0].due_ns <= t) {
        Due d = pop();
        Conn *c = &conns[d.fd];
        if (c->open && c->streaming && c->due_ns == d.due_ns) write_event(ep, d.fd, d.due_ns);
        t = now_ns();
    }
    struct itimerspec at = {0};
    if (heap_len) {
        at.it_value.tv_sec = heap[0].due_ns / 1000000000;
        at.it_value.tv_nsec = heap[0].due_ns % 1000000000;
    }
    timerfd_settime(timer, TFD_TIMER_ABSTIME, &at, NULL);
}

int main(int argc, char **argv) {
    int port = 0;
    const char *port_file = NULL, *stats = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--port-file")) port_file = argv[i + 1];
        else if (!strcmp(argv[i], "--ttft-ms")) ttft_ns = (int64_t)(atof(argv[i + 1]) * 1e6);
        else if (!strcmp(argv[i], "--itl-ms")) itl_ns = (int64_t)(atof(argv[i + 1]) * 1e6);
        else if (!strcmp(argv[i], "--stats")) stats = argv[i + 1];
        else {
            fprintf(stderr, "sse_mock: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    struct rlimit nofile = {MAX_FD, MAX_FD};
    if (setrlimit(RLIMIT_NOFILE, &nofile)) {
        getrlimit(RLIMIT_NOFILE, &nofile);
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    conns = calloc(MAX_FD, sizeof *conns);
    prctl(PR_SET_TIMERSLACK, 1UL); /* timers on time to the microsecond, not 50 us late */
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int s = listen_on(port, port_file), ep = epoll_create1(0);
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
            if (fd == s) accept_all(ep, s);
            else if (fd == timer) {
                uint64_t expired;
                ssize_t got = read(timer, &expired, sizeof expired);
                (void)got;
            } else if (conns[fd].open) {
                if (ready[i].events & EPOLLOUT) flush_out(ep, fd);
                if (conns[fd].open && ready[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                    on_readable(ep, fd);
            }
        }
        fire_due(ep, timer);
    }
    write_stats(stats);
    return 0;
}
