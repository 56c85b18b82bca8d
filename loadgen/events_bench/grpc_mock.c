/* grpc_mock: the moe.v1 MoEInference service (proto/moe.proto) with known delays over HTTP/2,
 * native, so that a gRPC client can be measured without the server taking the cores it needs
 * (make bench-loadgen, docs/measured.md; the Python reference server, loadgen/delay_server.py,
 * takes most of a core at 8,000 messages/s).
 *
 * Generate streams max_tokens messages of one token each (id 97, text "a"): the first --ttft-ms
 * after the request's last bytes arrived (when the kernel received them), then one every
 * --itl-ms, the last with finish_reason LENGTH and usage (prompt and completion tokens, ttft_us);
 * each carries server_elapsed_us, its write time from the arrival: the truth. The standard
 * health check (grpc.health.v1.Health/Check) answers SERVING; any other method UNIMPLEMENTED;
 * a request it cannot read INVALID_ARGUMENT. Its account at SIGTERM is sse_mock's (mock_core.h).
 *
 * Of HTTP/2 (RFC 9113) what a gRPC client needs: the preface, SETTINGS and PING answered, flow
 * control both ways (a message waits for the peer's window; what it reads it gives back),
 * RST_STREAM, CONTINUATION. Request headers are decoded (HPACK, RFC 7541, with the client's
 * dynamic table) for :path alone; a Huffman-coded string, which gRPC clients do not send for
 * text headers, ends the connection with GOAWAY (COMPRESSION_ERROR). Responses use literal
 * headers, no table of its own.
 *
 *   grpc_mock --port 0 --port-file F --ttft-ms 20 --itl-ms 10 --stats S
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "mock_core.h"

#define IN_CAP 65536        /* more than a frame: the mock never offers a larger one */
#define FRAME_MAX 16384     /* SETTINGS_MAX_FRAME_SIZE's default */
#define TABLE_MAX 4096      /* the HPACK table's default size, which it keeps */
#define TABLE_SLOTS (TABLE_MAX / 32)
#define BODY_MAX (1 << 20)  /* a request larger than this is refused */
#define MAX_STREAMS 65536
#define OUR_WINDOW (1 << 24) /* what it lets a client send ahead, per stream and in all */
#define RETRY_NS 100000      /* a message held by the peer's window is tried again after */

enum { DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH, PING, GOAWAY, WINDOW_UPDATE,
       CONTINUATION };
enum { END_STREAM = 1, ACK = 1, END_HEADERS = 4, PADDED = 8, PRIORITIZED = 0x20 };
enum { OTHER, GENERATE, HEALTH };
enum { OK = 0, INVALID_ARGUMENT = 3, RESOURCE_EXHAUSTED = 8, UNIMPLEMENTED = 12 };

typedef struct {
    char *name, *value;
    size_t name_len, value_len;
} Entry;

typedef struct {
    int open, preface;
    char *in;
    size_t in_len;
    int64_t in_ns; /* when the kernel received the bytes last read (0: not known) */
    OutBuf out;
    int64_t send_window, initial_window; /* the peer's: what it may be sent */
    uint32_t given_back;                 /* bytes read and not yet given back as window */
    Entry table[TABLE_SLOTS];            /* a ring: newest at head */
    int head, count;
    size_t size, max;
    char *block; /* a header block, whole once a frame ends it (END_HEADERS) */
    size_t block_len;
    uint32_t block_stream;
    int block_ends, block_open; /* the request ends with it; CONTINUATION awaited */
    int *streams, n_streams, streams_cap; /* slots of its open streams */
} Conn;

typedef struct {
    int used, fd, method, prompt, left, sent;
    uint32_t id;
    char *body;
    size_t body_len;
    int64_t window, arrived_ns, first_ns, last_ns, due_ns, wake_ns;
} Stream;

static Conn *conns[MAX_FD];
static Stream streams[MAX_STREAMS];
static int free_slots[MAX_STREAMS], n_free;

static const char *const STATIC_NAMES[62] = {
    "", ":authority", ":method", ":method", ":path", ":path", ":scheme", ":scheme", ":status",
    ":status", ":status", ":status", ":status", ":status", ":status", "accept-charset",
    "accept-encoding", "accept-language", "accept-ranges", "accept",
    "access-control-allow-origin", "age", "allow", "authorization", "cache-control",
    "content-disposition", "content-encoding", "content-language", "content-length",
    "content-location", "content-range", "content-type", "cookie", "date", "etag", "expect",
    "expires", "from", "host", "if-match", "if-modified-since", "if-none-match", "if-range",
    "if-unmodified-since", "last-modified", "link", "location", "max-forwards",
    "proxy-authenticate", "proxy-authorization", "range", "referer", "refresh", "retry-after",
    "server", "set-cookie", "strict-transport-security", "transfer-encoding", "user-agent",
    "vary", "via", "www-authenticate"};

/* --- HPACK: the request's :path --- */

static int hp_int(const uint8_t **p, const uint8_t *end, int prefix, uint64_t *out) {
    if (*p >= end) return -1;
    uint64_t max = (1u << prefix) - 1, v = *(*p)++ & max;
    for (int shift = 0; v >= max && shift <= 28; shift += 7) {
        if (*p >= end) return -1;
        uint8_t b = *(*p)++;
        v += (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
    }
    *out = v;
    return 0;
}

/* -2 for a Huffman-coded string */
static int hp_string(const uint8_t **p, const uint8_t *end, const char **s, size_t *len) {
    if (*p >= end) return -1;
    int huffman = **p & 0x80;
    uint64_t n;
    if (hp_int(p, end, 7, &n) || n > (uint64_t)(end - *p)) return -1;
    if (huffman) return -2;
    *s = (const char *)*p;
    *len = n;
    *p += n;
    return 0;
}

static void evict_to(Conn *c, size_t max) {
    while (c->count && c->size > max) {
        Entry *e = &c->table[(c->head + TABLE_SLOTS - c->count + 1) % TABLE_SLOTS];
        c->size -= e->name_len + e->value_len + 32;
        free(e->name);
        free(e->value);
        c->count--;
    }
}

static void insert(Conn *c, const char *name, size_t name_len, const char *value,
                   size_t value_len) {
    char *n = malloc(name_len + 1), *v = malloc(value_len + 1);
    memcpy(n, name, name_len);
    memcpy(v, value, value_len);
    size_t size = name_len + value_len + 32;
    evict_to(c, size > c->max ? 0 : c->max - size);
    if (size > c->max) {
        free(n);
        free(v);
        return;
    }
    c->head = (c->head + 1) % TABLE_SLOTS;
    c->table[c->head] = (Entry){n, v, name_len, value_len};
    c->count++;
    c->size += size;
}

/* The header at index (static, then the dynamic table's newest first); -1 if none. */
static int lookup(Conn *c, uint64_t index, const char **name, size_t *name_len,
                  const char **value, size_t *value_len) {
    static const char *const paths[] = {"/", "/index.html"};
    if (index >= 1 && index <= 61) {
        *name = STATIC_NAMES[index];
        *name_len = strlen(*name);
        *value = index == 4 || index == 5 ? paths[index - 4] : "";
        *value_len = strlen(*value);
        return 0;
    }
    if (index < 62 || index - 62 >= (uint64_t)c->count) return -1;
    Entry *e = &c->table[(c->head + TABLE_SLOTS - (int)(index - 62)) % TABLE_SLOTS];
    *name = e->name;
    *name_len = e->name_len;
    *value = e->value;
    *value_len = e->value_len;
    return 0;
}

static int method_of(const char *path, size_t len) {
    static const char generate[] = "/moe.v1.MoEInference/Generate";
    static const char health[] = "/grpc.health.v1.Health/Check";
    if (len == sizeof generate - 1 && !memcmp(path, generate, len)) return GENERATE;
    if (len == sizeof health - 1 && !memcmp(path, health, len)) return HEALTH;
    return OTHER;
}

/* One header field at *p: its name and value, the table kept. 0, -1 (malformed), -2 (Huffman) */
static int field(Conn *c, const uint8_t **p, const uint8_t *end, const char **name,
                 size_t *name_len, const char **value, size_t *value_len) {
    uint8_t first = **p;
    uint64_t index;
    int indexed = first & 0x80, incremental = (first & 0xc0) == 0x40, err;
    if (!indexed && !incremental && (first & 0x20)) { /* a table size update */
        if (hp_int(p, end, 5, &index) || index > TABLE_MAX) return -1;
        c->max = index;
        evict_to(c, c->max);
        *name_len = 0;
        return 0;
    }
    if (hp_int(p, end, indexed ? 7 : incremental ? 6 : 4, &index)) return -1;
    if (indexed) return index ? lookup(c, index, name, name_len, value, value_len) : -1;
    if (index) {
        const char *ignored;
        size_t ignored_len;
        if (lookup(c, index, name, name_len, &ignored, &ignored_len)) return -1;
    } else if ((err = hp_string(p, end, name, name_len))) {
        return err;
    }
    if ((err = hp_string(p, end, value, value_len))) return err;
    if (incremental) insert(c, *name, *name_len, *value, *value_len);
    return 0;
}

/* The method a header block calls, or -1 (malformed), -2 (Huffman). Names are copied out of the
 * table before an insert can evict them. */
static int decode_block(Conn *c, const uint8_t *p, const uint8_t *end) {
    int method = OTHER;
    while (p < end) {
        const char *name, *value;
        size_t name_len, value_len;
        int err = field(c, &p, end, &name, &name_len, &value, &value_len);
        if (err) return err;
        if (name_len == 5 && !memcmp(name, ":path", 5)) method = method_of(value, value_len);
    }
    return method;
}

/* --- frames out --- */

static void frame(Conn *c, uint32_t len, int type, int flags, uint32_t stream) {
    uint8_t h[9] = {(uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len, (uint8_t)type,
                    (uint8_t)flags, (uint8_t)(stream >> 24), (uint8_t)(stream >> 16),
                    (uint8_t)(stream >> 8), (uint8_t)stream};
    out_queue(&c->out, h, sizeof h);
}

static void window_update(Conn *c, uint32_t stream, uint32_t increment) {
    uint8_t v[4] = {(uint8_t)(increment >> 24), (uint8_t)(increment >> 16),
                    (uint8_t)(increment >> 8), (uint8_t)increment};
    frame(c, 4, WINDOW_UPDATE, 0, stream);
    out_queue(&c->out, v, 4);
}

static const uint8_t RESPONSE_HEADERS[] = "\x88\x0f\x10\x10" "application/grpc";

/* The response's headers: :status 200 (static 8), content-type (static name 31) literal. */
static void response_headers(Conn *c, uint32_t stream) {
    frame(c, sizeof RESPONSE_HEADERS - 1, HEADERS, END_HEADERS, stream);
    out_queue(&c->out, RESPONSE_HEADERS, sizeof RESPONSE_HEADERS - 1);
}

/* Trailers grpc-status (and grpc-message): alone, or with the headers (trailers-only). */
static void trailers(Conn *c, uint32_t stream, int status, const char *message, int only) {
    char block[512];
    size_t n = 0, m = message ? strlen(message) : 0;
    if (only) {
        memcpy(block, RESPONSE_HEADERS, sizeof RESPONSE_HEADERS - 1);
        n = sizeof RESPONSE_HEADERS - 1;
    }
    n += (size_t)snprintf(block + n, sizeof block - n, "%c%c%s%c%d", 0, 11, "grpc-status",
                          status >= 10 ? 2 : 1, status);
    if (m && m < 120) n += (size_t)snprintf(block + n, sizeof block - n, "%c%c%s%c%s", 0, 12,
                                            "grpc-message", (int)m, message);
    frame(c, (uint32_t)n, HEADERS, END_HEADERS | END_STREAM, stream);
    out_queue(&c->out, block, n);
}

/* One gRPC message (uncompressed) as one DATA frame. */
static void message(Conn *c, uint32_t stream, const uint8_t *msg, size_t len) {
    uint8_t prefix[5] = {0, (uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8),
                         (uint8_t)len};
    frame(c, (uint32_t)len + 5, DATA, 0, stream);
    out_queue(&c->out, prefix, 5);
    out_queue(&c->out, msg, len);
}

static size_t varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    for (; v >= 0x80; v >>= 7) p[n++] = (uint8_t)(v | 0x80);
    p[n++] = (uint8_t)v;
    return n;
}

/* --- streams --- */

static void close_conn(int ep, int fd);

static void flush_out(int ep, int fd) {
    if (out_flush(ep, fd, &conns[fd]->out)) close_conn(ep, fd);
}

static Stream *find(Conn *c, uint32_t id) {
    for (int i = 0; i < c->n_streams; i++)
        if (streams[c->streams[i]].id == id) return &streams[c->streams[i]];
    return NULL;
}

static void end_stream(Conn *c, Stream *s) {
    int slot = (int)(s - streams);
    for (int i = 0; i < c->n_streams; i++)
        if (c->streams[i] == slot) c->streams[i] = c->streams[--c->n_streams];
    free(s->body);
    memset(s, 0, sizeof *s);
    free_slots[n_free++] = slot;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int pb_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* The GenerateRequest in the stream's gRPC message: its prompt (token ids, or the text's
 * bytes) and max_tokens into s->left; -1 where it is not one. */
static int read_generate(Stream *s) {
    const uint8_t *p = (const uint8_t *)s->body, *end = p + s->body_len;
    if (s->body_len < 5 || p[0] || be32(p + 1) != s->body_len - 5) return -1;
    for (p += 5; p < end;) {
        uint64_t key, v;
        if (pb_varint(&p, end, &key)) return -1;
        int number = (int)(key >> 3), wire = (int)(key & 7);
        if (wire == 0) {
            if (pb_varint(&p, end, &v)) return -1;
            s->prompt += number == 3;
            if (number == 4) s->left = v > 1000000 ? 1000000 : (int)v;
        } else if (wire == 2) {
            if (pb_varint(&p, end, &v) || v > (uint64_t)(end - p)) return -1;
            const uint8_t *next = p + v;
            for (; number == 3 && p < next; s->prompt++)
                if (pb_varint(&p, next, &key)) return -1;
            s->prompt += number == 2 ? (int)v : 0;
            p = next;
        } else if (wire == 1 || wire == 5) {
            if (end - p < (wire == 1 ? 8 : 4)) return -1;
            p += wire == 1 ? 8 : 4;
        } else {
            return -1;
        }
    }
    return 0;
}

/* A request whole (its END_STREAM read): answered at once, or its first message scheduled. */
static void dispatch(Conn *c, Stream *s) {
    static const uint8_t serving[] = {0x08, 0x01}; /* HealthCheckResponse{status: SERVING} */
    if (s->method == HEALTH) {
        response_headers(c, s->id);
        message(c, s->id, serving, sizeof serving);
        trailers(c, s->id, OK, NULL, 0);
    } else if (s->method == OTHER) {
        trailers(c, s->id, UNIMPLEMENTED, "grpc_mock serves Generate and the health check", 1);
    } else if (read_generate(s) || s->left < 1) {
        trailers(c, s->id, INVALID_ARGUMENT, "grpc_mock: not a GenerateRequest with max_tokens "
                 ">= 1", 1);
    } else {
        response_headers(c, s->id);
        s->arrived_ns = c->in_ns ? c->in_ns : now_ns();
        s->due_ns = s->wake_ns = s->arrived_ns + ttft_ns;
        push_due(s->wake_ns, (int)(s - streams));
        requests++;
        return;
    }
    end_stream(c, s);
}

/* The stream's next message, due now; or tried again when the peer's window is too small. */
static void write_message(int ep, Stream *s) {
    int fd = s->fd; /* the stream is gone after its last message */
    Conn *c = conns[fd];
    int last = s->left == 1;
    uint8_t msg[96] = {0x0a, 0x01, 97, 0x12, 0x01, 'a'}, usage[40];
    size_t n = 6;
    if (last) {
        msg[n++] = 0x18;
        msg[n++] = 1; /* LENGTH */
    }
    int64_t t = now_ns();
    msg[n++] = 0x20;
    n += varint(msg + n, (uint64_t)(t - s->arrived_ns) / 1000);
    if (last) {
        size_t u = 0;
        usage[u++] = 0x08;
        u += varint(usage + u, (uint64_t)s->prompt);
        usage[u++] = 0x10;
        u += varint(usage + u, (uint64_t)s->sent + 1);
        usage[u++] = 0x30;
        u += varint(usage + u, (uint64_t)((s->sent ? s->first_ns : t) - s->arrived_ns) / 1000);
        msg[n++] = 0x2a;
        msg[n++] = (uint8_t)u;
        memcpy(msg + n, usage, u);
        n += u;
    }
    if ((int64_t)n + 5 > c->send_window || (int64_t)n + 5 > s->window) {
        s->wake_ns = t + RETRY_NS;
        push_due(s->wake_ns, (int)(s - streams));
        return;
    }
    account_event(t, s->due_ns, s->sent ? s->last_ns : 0);
    if (!s->sent) s->first_ns = t;
    s->last_ns = t;
    s->sent++;
    s->left--;
    c->send_window -= (int64_t)n + 5;
    s->window -= (int64_t)n + 5;
    message(c, s->id, msg, n);
    if (last) {
        trailers(c, s->id, OK, NULL, 0);
        end_stream(c, s);
    } else {
        s->due_ns += itl_ns;
        s->wake_ns = s->due_ns;
        push_due(s->wake_ns, (int)(s - streams));
    }
    flush_out(ep, fd);
}

static void on_due(int ep, Due d) {
    Stream *s = &streams[d.key];
    if (s->used && s->wake_ns == d.due_ns && s->left > 0) write_message(ep, s);
}

/* --- frames in --- */

static Stream *open_stream(Conn *c, int fd, uint32_t id, int method) {
    if (!n_free) return NULL;
    int slot = free_slots[--n_free];
    Stream *s = &streams[slot];
    *s = (Stream){.used = 1, .fd = fd, .method = method, .id = id, .window = c->initial_window};
    if (c->n_streams == c->streams_cap) {
        c->streams_cap = c->streams_cap ? 2 * c->streams_cap : 64;
        c->streams = realloc(c->streams, (size_t)c->streams_cap * sizeof *c->streams);
    }
    c->streams[c->n_streams++] = slot;
    return s;
}

static void goaway(Conn *c, uint32_t code) {
    uint8_t body[8] = {0, 0, 0, 0, (uint8_t)(code >> 24), (uint8_t)(code >> 16),
                       (uint8_t)(code >> 8), (uint8_t)code};
    frame(c, 8, GOAWAY, 0, 0);
    out_queue(&c->out, body, 8);
}

/* A header block whole: its stream opened (or refused where none is free). -1: end the
 * connection. */
static int headers_done(Conn *c, int fd) {
    int method = decode_block(c, (const uint8_t *)c->block, (const uint8_t *)c->block + c->block_len);
    c->block_len = 0;
    if (method < 0) {
        fprintf(stderr, "grpc_mock: %s\n", method == -2 ? "a Huffman-coded header: not read"
                                                          : "a malformed header block");
        goaway(c, method == -2 ? 9 : 1); /* COMPRESSION_ERROR, PROTOCOL_ERROR */
        return -1;
    }
    Stream *s = find(c, c->block_stream);
    if (s) return 0; /* trailers from the client: nothing to answer */
    s = open_stream(c, fd, c->block_stream, method);
    if (!s) trailers(c, c->block_stream, RESOURCE_EXHAUSTED, "grpc_mock: too many streams", 1);
    else if (c->block_ends) dispatch(c, s);
    return 0;
}

/* A frame's payload less its padding (and a HEADERS frame's priority); -1 if malformed. */
static int unpadded(int type, int flags, const uint8_t **p, uint32_t *len) {
    uint32_t pad = 0, skip = 0;
    if ((type == DATA || type == HEADERS) && (flags & PADDED)) {
        if (*len < 1) return -1;
        pad = **p;
        skip = 1;
    }
    if (type == HEADERS && (flags & PRIORITIZED)) skip += 5;
    if (skip + pad > *len) return -1;
    *p += skip;
    *len -= skip + pad;
    return 0;
}

static void data_frame(Conn *c, int flags, uint32_t id, const uint8_t *p, uint32_t len,
                       uint32_t frame_len) {
    c->given_back += frame_len;
    if (c->given_back >= OUR_WINDOW / 4) {
        window_update(c, 0, c->given_back);
        c->given_back = 0;
    }
    Stream *s = find(c, id);
    if (!s || s->arrived_ns) return; /* a stream refused, or answered before its end */
    if (s->body_len + len > BODY_MAX) {
        trailers(c, id, RESOURCE_EXHAUSTED, "grpc_mock: a request over 1 MiB", 1);
        end_stream(c, s);
        return;
    }
    s->body = realloc(s->body, s->body_len + len + 1);
    memcpy(s->body + s->body_len, p, len);
    s->body_len += len;
    if (flags & END_STREAM) dispatch(c, s);
}

static void settings(Conn *c, const uint8_t *p, uint32_t len) {
    for (uint32_t i = 0; i + 6 <= len; i += 6) {
        int id = p[i] << 8 | p[i + 1];
        int64_t value = be32(p + i + 2);
        if (id != 4) continue; /* SETTINGS_INITIAL_WINDOW_SIZE */
        for (int k = 0; k < c->n_streams; k++) streams[c->streams[k]].window += value - c->initial_window;
        c->initial_window = value;
    }
    frame(c, 0, SETTINGS, ACK, 0);
}

/* One whole frame; -1: end the connection. */
static int on_frame(Conn *c, int fd, int type, int flags, uint32_t id, const uint8_t *p,
                    uint32_t len) {
    uint32_t frame_len = len;
    if (c->block_open != (type == CONTINUATION)) return -1;
    if (unpadded(type, flags, &p, &len)) return -1;
    if (type == HEADERS || type == CONTINUATION) {
        if (type == HEADERS) {
            c->block_stream = id;
            c->block_ends = flags & END_STREAM;
        } else if (id != c->block_stream) {
            return -1;
        }
        c->block = realloc(c->block, c->block_len + len + 1);
        memcpy(c->block + c->block_len, p, len);
        c->block_len += len;
        c->block_open = !(flags & END_HEADERS);
        return c->block_open ? 0 : headers_done(c, fd);
    }
    if (type == DATA) data_frame(c, flags, id, p, len, frame_len);
    else if (type == SETTINGS && !(flags & ACK)) settings(c, p, len);
    else if (type == PING && !(flags & ACK) && len == 8) {
        frame(c, 8, PING, ACK, 0);
        out_queue(&c->out, p, 8);
    } else if (type == WINDOW_UPDATE && len == 4) {
        Stream *s = id ? find(c, id) : NULL;
        if (!id) c->send_window += be32(p) & 0x7fffffff;
        else if (s) s->window += be32(p) & 0x7fffffff;
    } else if (type == RST_STREAM) {
        Stream *s = find(c, id);
        if (s) end_stream(c, s);
    }
    return 0;
}

/* Every whole frame read; -1: end the connection. */
static int on_frames(Conn *c, int fd) {
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    size_t at = 0;
    if (!c->preface) {
        if (c->in_len < sizeof preface - 1) return 0;
        if (memcmp(c->in, preface, sizeof preface - 1)) return -1;
        c->preface = 1;
        at = sizeof preface - 1;
    }
    while (c->in_len - at >= 9) {
        const uint8_t *h = (const uint8_t *)c->in + at;
        uint32_t len = (uint32_t)h[0] << 16 | (uint32_t)h[1] << 8 | h[2];
        if (len > FRAME_MAX) return -1;
        if (c->in_len - at < 9 + len) break;
        if (on_frame(c, fd, h[3], h[4], be32(h + 5) & 0x7fffffff, h + 9, len)) return -1;
        at += 9 + len;
    }
    memmove(c->in, c->in + at, c->in_len - at);
    c->in_len -= at;
    return 0;
}

static void on_readable(int ep, int fd) {
    Conn *c = conns[fd];
    if (!c) return;
    for (;;) {
        ssize_t n = read_stamped(fd, c->in + c->in_len, IN_CAP - c->in_len, &c->in_ns);
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            close_conn(ep, fd);
            return;
        }
        if (n < 0) break;
        c->in_len += (size_t)n;
        if (on_frames(c, fd)) {
            flush_out(ep, fd);
            close_conn(ep, fd);
            return;
        }
    }
    flush_out(ep, fd);
}

static void on_accepted(int ep, int fd) {
    Conn *c = calloc(1, sizeof *c);
    c->open = 1;
    c->in = malloc(IN_CAP);
    c->send_window = c->initial_window = 65535;
    c->max = TABLE_MAX;
    conns[fd] = c;
    /* SETTINGS_INITIAL_WINDOW_SIZE, and the connection's window to match */
    static const uint8_t ours[6] = {0, 4, (uint8_t)(OUR_WINDOW >> 24),
                                    (uint8_t)(OUR_WINDOW >> 16), (uint8_t)(OUR_WINDOW >> 8),
                                    (uint8_t)OUR_WINDOW};
    frame(c, 6, SETTINGS, 0, 0);
    out_queue(&c->out, ours, 6);
    window_update(c, 0, OUR_WINDOW - 65535);
    flush_out(ep, fd);
}

static void on_writable(int ep, int fd) {
    if (conns[fd]) flush_out(ep, fd);
}

static void close_conn(int ep, int fd) {
    Conn *c = conns[fd];
    if (!c) return;
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    while (c->n_streams) end_stream(c, &streams[c->streams[0]]);
    evict_to(c, 0);
    free(c->streams);
    free(c->block);
    free(c->in);
    free(c->out.data);
    free(c);
    conns[fd] = NULL;
}

int main(int argc, char **argv) {
    for (int i = MAX_STREAMS - 1; i >= 0; i--) free_slots[n_free++] = i;
    ttft_ns = 20000000;
    MockHandlers h = {"grpc_mock", on_accepted, on_readable, on_writable, on_due};
    return mock_main(argc, argv, &h);
}
