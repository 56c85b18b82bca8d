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
 * On SIGTERM or SIGINT it writes its own account to --stats as JSON and exits (mock_core.h):
 * requests, events, its lateness (write time past the event's due time) p50/p99/max in us, and
 * the mean and standard deviation of the gaps it put between a stream's events (the truth's
 * ITL).
 *
 *   sse_mock --port 0 --port-file F --ttft-ms 50 --itl-ms 10 --stats S
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "mock_core.h"

#define IN_CAP 65536
#define ID_CAP 128

typedef struct {
    int open, streaming;
    char in[IN_CAP];
    size_t in_len;
    OutBuf out;
    char id[ID_CAP];
    int ids, left, sent, prompt;
    int64_t arrived_ns, last_ns, first_ns, due_ns;
    int64_t in_ns; /* when the kernel received the bytes last read (0: not known) */
} Conn;

static Conn *conns;

static void close_conn(int ep, int fd) {
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    Conn *c = &conns[fd];
    free(c->out.data);
    memset(c, 0, sizeof *c);
}

static void flush_out(int ep, int fd) {
    if (out_flush(ep, fd, &conns[fd].out)) close_conn(ep, fd);
}

/* One server-sent event as one HTTP chunk. */
static void queue_event(Conn *c, const char *json, int len) {
    char head[32];
    int h = snprintf(head, sizeof head, "%x\r\ndata: ", len + 8);
    out_queue(&c->out, head, (size_t)h);
    out_queue(&c->out, json, (size_t)len);
    out_queue(&c->out, "\n\n\r\n", 4);
}

static void write_event(int ep, int fd, int64_t due_ns) {
    Conn *c = &conns[fd];
    int64_t t = now_ns();
    account_event(t, due_ns, c->sent ? c->last_ns : 0);
    if (!c->sent) c->first_ns = t;
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
        out_queue(&c->out, "0\r\n\r\n", 5);
        c->streaming = 0;
    } else {
        c->due_ns = due_ns + itl_ns;
        push_due(c->due_ns, fd);
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
        out_queue(&c->out, head, (size_t)h);
        out_queue(&c->out, models, sizeof models - 1);
    } else {
        static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                   "Transfer-Encoding: chunked\r\n\r\n";
        out_queue(&c->out, head, sizeof head - 1);
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
        push_due(c->due_ns, fd);
        requests++;
    }
    body[body_len] = saved;
    flush_out(ep, fd);
    return head_len + (size_t)body_len;
}

static void on_readable(int ep, int fd) {
    Conn *c = &conns[fd];
    if (!c->open) return;
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

static void on_accepted(int ep, int fd) {
    (void)ep;
    conns[fd].open = 1;
}

static void on_writable(int ep, int fd) {
    if (conns[fd].open) flush_out(ep, fd);
}

static void on_due(int ep, Due d) {
    Conn *c = &conns[d.key];
    if (c->open && c->streaming && c->due_ns == d.due_ns) write_event(ep, d.key, d.due_ns);
}

int main(int argc, char **argv) {
    conns = calloc(MAX_FD, sizeof *conns);
    MockHandlers h = {"sse_mock", on_accepted, on_readable, on_writable, on_due};
    return mock_main(argc, argv, &h);
}
