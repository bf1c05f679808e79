/*
 * shim.cc - shim.h over gloo's C++ API: the rendezvous context on the TCP
 * transport and its unbound buffers. Exceptions stop here.
 */
#include "comm/gloo/shim.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/tcp/unbound_buffer.h>

struct mpu__gl {
  std::shared_ptr<gloo::transport::Device> dev;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
};

struct mpu__gl_buf {
  std::unique_ptr<gloo::transport::UnboundBuffer> ub;
};

namespace {

void say(char *err, size_t errn, const char *what) {
  if (err && errn) std::snprintf(err, errn, "%s", what);
}

std::chrono::milliseconds ms(double s) {
  if (!(s < 1e6)) s = 1e6; /* "no timeout" (infinite or huge): about 11 days */
  double v = std::ceil(s * 1000.0);
  return std::chrono::milliseconds(v < 1 ? 1 : (long long)v);
}

/* gloo's rendezvous store over the backend's TCPStore client */
class Store : public gloo::rendezvous::Store {
 public:
  Store(const mpu__gl_store *s, double timeout_s) : s_(s), timeout_s_(timeout_s) {}
  void set(const std::string &key, const std::vector<char> &data) override {
    char err[512] = "";
    if (s_->set(s_->ctx, key.c_str(), data.data(), data.size(), err, sizeof err))
      throw gloo::IoException(err);
  }
  std::vector<char> get(const std::string &key) override { return fetch(key, timeout_s_); }
  void wait(const std::vector<std::string> &keys) override {
    for (auto &k : keys) fetch(k, timeout_s_);
  }
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &t) override {
    for (auto &k : keys) fetch(k, (double)t.count() / 1000.0);
  }

 private:
  std::vector<char> fetch(const std::string &key, double timeout_s) {
    char err[512] = "";
    void *v = nullptr;
    size_t n = 0;
    if (s_->get(s_->ctx, key.c_str(), &v, &n, timeout_s, err, sizeof err))
      throw gloo::IoException(err);
    std::vector<char> out((char *)v, (char *)v + n);
    std::free(v);
    return out;
  }
  const mpu__gl_store *s_;
  double timeout_s_;
};

/* The process's one TCP device (a listening socket and gloo's event loop
 * thread), shared by its contexts and freed with the last. */
std::mutex dev_mu;
std::weak_ptr<gloo::transport::Device> dev_shared;

/* How many of a buffer's sends completed: gloo keeps the count but has no
 * call that reads it without blocking; a member pointer named through a
 * subclass reaches the protected fields (and the lock gloo guards them with). */
struct Peek : gloo::transport::tcp::UnboundBuffer {
  static int sends_done(gloo::transport::UnboundBuffer *b) {
    auto *t = static_cast<gloo::transport::tcp::UnboundBuffer *>(b);
    std::mutex gloo::transport::tcp::UnboundBuffer::*mu = &Peek::m_;
    int gloo::transport::tcp::UnboundBuffer::*n = &Peek::sendCompletions_;
    std::lock_guard<std::mutex> lock(t->*mu);
    return t->*n;
  }
  /* Take b's lock once: every touch of gloo's loop thread so far (a
   * completion, an error it signalled, both under that lock) happens before
   * what follows. Gloo's own guard against freeing a buffer its loop uses (a
   * shared_ptr's count, gloo/common/memory.h) is invisible to
   * ThreadSanitizer in an uninstrumented libgloo. What the loop does after
   * (an error a peer's close signals) only that guard orders: tests/tsan.supp. */
  static void settle(gloo::transport::UnboundBuffer *b) {
    auto *t = static_cast<gloo::transport::tcp::UnboundBuffer *>(b);
    std::mutex gloo::transport::tcp::UnboundBuffer::*mu = &Peek::m_;
    std::lock_guard<std::mutex> lock(t->*mu);
  }
};

int wait_result(const std::exception &e, char *err, size_t errn) {
  say(err, errn, e.what());
  return std::strstr(e.what(), "Timed out waiting") ? 1 : -1;
}

} // namespace

extern "C" {

int mpu__gl_connect(const char *host, int is_iface, int rank, int size, const mpu__gl_store *store,
                    double timeout_s, mpu__gl **out, char *err, size_t errn) {
  *out = nullptr;
  mpu__gl *g = nullptr;
  try {
    g = new mpu__gl;
    {
      std::lock_guard<std::mutex> lock(dev_mu);
      g->dev = dev_shared.lock();
      if (!g->dev) {
        gloo::transport::tcp::attr attr;
        if (is_iface) attr.iface = host;
        else attr.hostname = host;
        g->dev = gloo::transport::tcp::CreateDevice(attr);
        dev_shared = g->dev;
      }
    }
    g->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    g->ctx->setTimeout(ms(timeout_s));
    Store s(store, timeout_s);
    g->ctx->connectFullMesh(s, g->dev);
    *out = g;
    return 0;
  } catch (const std::exception &e) {
    say(err, errn, e.what());
  } catch (...) {
    say(err, errn, "gloo failed (an exception of an unknown type)");
  }
  delete g;
  return -1;
}

void mpu__gl_close(mpu__gl *g) {
  if (!g || !g->ctx) return;
  try {
    g->ctx->closeConnections();
  } catch (...) {
  }
}

void mpu__gl_free(mpu__gl *g) {
  if (!g) return;
  try {
    g->ctx.reset();
    std::lock_guard<std::mutex> lock(dev_mu);
    g->dev.reset(); /* the device (and its loop thread) goes with the last context */
  } catch (...) {
  }
  delete g;
}

mpu__gl_buf *mpu__gl_buf_new(mpu__gl *g, void *p, size_t n, char *err, size_t errn) {
  mpu__gl_buf *b = nullptr;
  try {
    b = new mpu__gl_buf;
    b->ub = g->ctx->createUnboundBuffer(p, n);
    return b;
  } catch (const std::exception &e) {
    say(err, errn, e.what());
  } catch (...) {
    say(err, errn, "gloo failed (an exception of an unknown type)");
  }
  delete b;
  return nullptr;
}

void mpu__gl_buf_free(mpu__gl_buf *b) {
  try {
    if (b) Peek::settle(b->ub.get());
    delete b;
  } catch (...) {
  }
}

int mpu__gl_send(mpu__gl_buf *b, int peer, uint64_t slot, size_t off, size_t n, char *err,
                 size_t errn) {
  try {
    b->ub->send(peer, slot, off, n);
    return 0;
  } catch (const std::exception &e) {
    say(err, errn, e.what());
    return -1;
  }
}

int mpu__gl_recv(mpu__gl_buf *b, int peer, uint64_t slot, size_t off, size_t n, char *err,
                 size_t errn) {
  try {
    b->ub->recv(peer, slot, off, n);
    return 0;
  } catch (const std::exception &e) {
    say(err, errn, e.what());
    return -1;
  }
}

int mpu__gl_wait_recv(mpu__gl_buf *b, double timeout_s, int *peer, char *err, size_t errn) {
  try {
    return b->ub->waitRecv(peer, ms(timeout_s)) ? 0 : -1;
  } catch (const std::exception &e) {
    return wait_result(e, err, errn);
  }
}

int mpu__gl_wait_send(mpu__gl_buf *b, double timeout_s, int *peer, char *err, size_t errn) {
  try {
    return b->ub->waitSend(peer, ms(timeout_s)) ? 0 : -1;
  } catch (const std::exception &e) {
    return wait_result(e, err, errn);
  }
}

void mpu__gl_buf_interrupt(mpu__gl_buf *b) {
  try {
    b->ub->abortWaitRecv();
    b->ub->abortWaitSend();
  } catch (...) {
  }
}

int mpu__gl_sends_done(mpu__gl_buf *b) {
  try {
    return Peek::sends_done(b->ub.get());
  } catch (...) {
    return 0;
  }
}

} // extern "C"
