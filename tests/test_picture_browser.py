#!/usr/bin/env python3
"""The HTML pictures in a real headless browser (Debian's chromium), in a
1400 x 1000 window.

For each page (`mpu plan --format html` of the flavours' layouts, at 8, 64 and
512 ranks too, and `mpu mesh --format html`): load it, click a rank with a real
mouse event (Chrome DevTools Protocol, Input.dispatchMouseEvent), and check that
each kind's small grid highlights exactly that rank's group as `--format json`
lists it, that the side panel's table lists the rank's getters as `--per-rank`
gives them (by Megatron's getter names) or a mesh rank's coordinates, that
hovering another rank shows it and leaving returns to the pinned one, that the
kind selector recolours the grid, that no text is smaller than 9 pixels on the
screen and that no rank's cell is clipped (every cell and its number inside the
picture's visible width, no sideways scrolling); then take a screenshot. The
schedule SVG (`mpu plan --schedule ... --format svg`) gets the text-size check,
labels that agree with each block's tooltip, the whole schedule inside the
window (a viewBox, no block or text outside it, no sideways scrolling), and a
screenshot too. Usage: test_picture_browser.py MPU OUT_DIR. Exits 77
(skipped) when no chromium is installed.
"""
import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request


class WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol: text frames."""

    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n" % (u.path, u.hostname, u.port, key)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError("websocket handshake refused: %r" % head)

    def _read(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise RuntimeError("websocket closed")
            data += chunk
        return data

    def send(self, text):
        payload, mask = text.encode(), os.urandom(4)
        n = len(payload)
        head = bytes([0x81])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self):
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            message += self._read(n)
            if b0 & 0x80:
                return message.decode()


class Browser:
    def __init__(self, chromium, url, profile):
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-port=0", "--user-data-dir=" + profile, "--window-size=1400,1000",
             url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file, deadline = os.path.join(profile, "DevToolsActivePort"), time.time() + 60
        while not os.path.exists(port_file) or not open(port_file).read().strip():
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not start")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        targets = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port))
        page = next(t for t in targets if t["type"] == "page")
        self.ws, self.next_id = WebSocket(page["webSocketDebuggerUrl"]), 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError("%s: %s" % (method, reply["error"]))
                return reply["result"]

    def eval(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError("%s: %s" % (expression, result["exceptionDetails"]))
        return result["result"].get("value")

    def mouse(self, kind, x, y):
        params = {"type": kind, "x": x, "y": y}
        if kind != "mouseMoved":
            params.update(button="left", clickCount=1)
        self.call("Input.dispatchMouseEvent", **params)

    def close(self):
        self.proc.kill()
        self.proc.wait()


def centre(browser, rank):
    rect = browser.eval("(() => { const e = document.querySelector('#main [data-rank=\"%d\"]');"
                        " e.scrollIntoView({block: 'center', inline: 'center'});"
                        " const r = e.getBoundingClientRect();"
                        " return [r.x + r.width / 2, r.y + r.height / 2]; })()" % rank)
    return rect[0], rect[1]


# every text element's size on the screen (font size times the SVG's scale), the smallest
SMALLEST_TEXT = ("(() => { let least = 1e9, what = ''; document.querySelectorAll('text, th, td, h3, h4, "
                 "label, select').forEach(e => { if (!e.textContent.trim()) return; const svg = e.ownerSVGElement;"
                 " const scale = svg ? svg.getScreenCTM().a : 1;"
                 " const px = parseFloat(getComputedStyle(e).fontSize) * scale;"
                 " if (px < least) { least = px; what = e.textContent.slice(0, 40); } });"
                 " return [least, what]; })()")
# ranks whose cell (or its number) lies outside the picture's visible width
CLIPPED = ("(() => { const pic = document.getElementById('pic'); pic.scrollLeft = 0;"
           " const box = pic.getBoundingClientRect(), right = box.left + pic.clientWidth;"
           " const out = []; document.querySelectorAll('#main .cell').forEach(c => {"
           " const r = c.querySelector('rect').getBoundingClientRect();"
           " const t = c.querySelector('text').getBoundingClientRect();"
           " if (r.right > right || r.left < box.left || t.left < r.left || t.right > r.right)"
           " out.push(+c.dataset.rank); });"
           " return [out, pic.scrollWidth > pic.clientWidth]; })()")


def check_text(browser, name):
    least, what = browser.eval(SMALLEST_TEXT)
    return [] if least >= 9 else ["%s: text of %.1f px on the screen ('%s'), want 9 or more" % (name, least, what)]


def check_page(chromium, tmp, name, page_args, groups_of, getters, rank, other, shot):
    """groups_of(rank) -> {kind: sorted members or None}; getters(rank) -> dict or None."""
    failures = []
    html = os.path.join(tmp, name + ".html")
    with open(html, "w") as f:
        subprocess.run(page_args, stdout=f, check=True)
    profile = tempfile.mkdtemp(dir=tmp)
    browser = Browser(chromium, "file://" + html, profile)
    try:
        deadline = time.time() + 30
        while not browser.eval("document.readyState == 'complete' && location.protocol == 'file:'"
                               " && !!document.querySelector('#main')"):
            if time.time() > deadline:
                raise RuntimeError("page did not load")
            time.sleep(0.1)
        x, y = centre(browser, rank)
        browser.mouse("mouseMoved", x, y)
        browser.mouse("mousePressed", x, y)
        browser.mouse("mouseReleased", x, y)
        lit = browser.eval("(() => { const out = {}; document.querySelectorAll('g.kind').forEach(k =>"
                           " { out[k.dataset.kind] = [...k.querySelectorAll('.m.hl')]"
                           ".map(e => +e.dataset.rank).sort((a, b) => a - b); }); return out; })()")
        want = groups_of(rank)
        for kind, members in want.items():
            got = lit.get(kind)
            if got != (members or []):
                failures.append("%s: rank %d's %s group highlighted %s, want %s" % (name, rank, kind, got, members))
        if set(lit) != set(want):
            failures.append("%s: kinds drawn %s, want %s" % (name, sorted(lit), sorted(want)))
        if browser.eval("document.getElementById('sel').textContent") != "rank %d (pinned)" % rank:
            failures.append("%s: the side panel does not name rank %d" % (name, rank))
        table = browser.eval("[...document.querySelectorAll('#getters tr')].map(tr =>"
                             " [tr.dataset.key, tr.querySelector('th').textContent,"
                             " JSON.parse(tr.querySelector('td').textContent)])")
        want_info = getters(rank)
        if {k: v for k, _, v in table} != want_info:
            failures.append("%s: the table shown for rank %d differs from %s" % (name, rank, want_info))
        heading = browser.eval("document.querySelector('#side h4').textContent")
        if name.startswith("plan"):
            if not heading.startswith("getters") or not any(t.startswith("get_tensor_model_parallel_rank")
                                                            for _, t, _ in table):
                failures.append("%s: the getters are not by Megatron's names: %s" % (name, table[:3]))
        elif heading != "coordinates":
            failures.append("%s: a mesh's panel is headed %r, want coordinates" % (name, heading))
        failures += check_text(browser, name)
        clipped, scrolls = browser.eval(CLIPPED)
        if clipped or scrolls:
            failures.append("%s: ranks clipped at 1400 px: %s%s" % (name, clipped[:10],
                                                                   " (the picture scrolls sideways)" if scrolls else ""))
        # the selector colours the grid by another kind: the cells' numbers become its groups
        kinds = browser.eval("D.kinds.map(k => k.name)")
        last = len(kinds) - 1
        got = browser.eval("(() => { const s = document.getElementById('colour-by'); s.value = %d;"
                           " s.dispatchEvent(new Event('change')); return [...document.querySelectorAll("
                           "'#main .cell')].map(c => [+c.dataset.rank, c.querySelector('.gn').textContent]); })()"
                           % last)
        want_numbers = browser.eval("D.kinds[%d].g" % last)
        if any(t != (str(want_numbers[r]) if want_numbers[r] >= 0 else "") for r, t in got):
            failures.append("%s: colouring by %s does not number the cells by its groups" % (name, kinds[last]))
        browser.eval("(() => { const s = document.getElementById('colour-by'); s.value = D.fill;"
                     " s.dispatchEvent(new Event('change')); })()")
        shot_png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
        open(shot, "wb").write(shot_png)
        if not shot_png.startswith(b"\x89PNG") or len(shot_png) < 5000:
            failures.append("%s: the screenshot is not a picture" % name)
        # hover another rank, then leave it: the pinned rank comes back
        ox, oy = centre(browser, other)
        browser.mouse("mouseMoved", ox, oy)
        if browser.eval("document.getElementById('sel').textContent") != "rank %d" % other:
            failures.append("%s: hovering rank %d does not show it" % (name, other))
        browser.mouse("mouseMoved", 5, 5)
        if browser.eval("document.getElementById('sel').textContent") != "rank %d (pinned)" % rank:
            failures.append("%s: leaving rank %d does not return to the pinned rank" % (name, other))
    finally:
        browser.close()
    return failures


def check_svg(chromium, tmp, name, args, shot):
    """An SVG alone (the schedule): text sizes, and a screenshot."""
    path = os.path.join(tmp, name + ".svg")
    with open(path, "w") as f:
        subprocess.run(args, stdout=f, check=True)
    profile = tempfile.mkdtemp(dir=tmp)
    browser = Browser(chromium, "file://" + path, profile)
    failures = []
    try:
        deadline = time.time() + 30
        while not browser.eval("document.readyState == 'complete' && !!document.querySelector('text')"):
            if time.time() > deadline:
                raise RuntimeError("svg did not load")
            time.sleep(0.1)
        failures += check_text(browser, name)
        labels = browser.eval("[...document.querySelectorAll('g.block')].map(g => [g.querySelector('title')"
                              ".textContent, g.querySelector('text') ? g.querySelector('text').textContent : null])")
        if not labels or any(not t for t, _ in labels):
            failures.append("%s: a block without a tooltip" % name)
        # each block labelled, as "F m.c", "m.c" or "m" where narrow, agreeing with its tooltip
        for title, label in labels:
            m = re.search(r"(forward|backward) of micro-batch (\d+), chunk (\d+)", title or "")
            if not m or label not in ("%s %s.%s" % (m[1][0].upper(), m[2], m[3]), "%s.%s" % (m[2], m[3]), m[2]):
                failures.append("%s: block '%s' is labelled %r" % (name, title, label))
                break
        if not any(l and l.startswith("B ") for _, l in labels):
            failures.append("%s: no backward block says B m.c" % name)
        # the whole schedule inside the 1400-pixel window: a viewBox, no scrolling, every block in view
        fit = browser.eval("(() => { const s = document.documentElement, w = innerWidth, h = innerHeight;"
                           " const out = [...document.querySelectorAll('g.block rect, text')].filter(e => {"
                           " const r = e.getBoundingClientRect(); return r.left < 0 || r.right > w || r.top < 0"
                           " || r.bottom > h; }).length;"
                           " return [s.getAttribute('viewBox'), out, s.scrollWidth > w, w]; })()")
        if not fit[0] or fit[1] or fit[2]:
            failures.append("%s: in a %d-pixel window: viewBox %s, %d blocks or texts outside it%s"
                            % (name, fit[3], fit[0], fit[1], ", a sideways scroll bar" if fit[2] else ""))
        shot_png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
        open(shot, "wb").write(shot_png)
    finally:
        browser.close()
    return failures


def main():
    mpu, out = sys.argv[1], sys.argv[2]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("SKIP: no chromium")
        return 77
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    failures, passes = [], 0
    try:
        layouts = {
            "deepspeed": ["--flavor", "deepspeed", "--world-size", "32", "--tp", "2", "--pp", "2", "--fp8"],
            "deepspeed_sp": ["--flavor", "deepspeed", "--world-size", "16", "--sp", "4"],
            "core": ["--world-size", "32", "--tp", "2", "--pp", "2", "--cp", "2", "--ep", "2", "--vp", "2"],
            "core_order": ["--world-size", "24", "--tp", "2", "--pp", "3", "--order", "tp-dp-pp"],
            "core019": ["--flavor", "core-0.19", "--world-size", "32", "--tp", "2", "--pp", "2", "--cp", "2",
                        "--ep", "4", "--etp", "1", "--hcp", "2", "--dist-opt-instances", "2"],
            # the sizes a reader meets: 8, 64 and 512 ranks
            "8": ["--world-size", "8", "--tp", "2", "--pp", "2"],
            "64": ["--world-size", "64", "--tp", "2", "--pp", "4", "--cp", "2", "--ep", "2", "--vp", "2"],
            "512": ["--world-size", "512", "--tp", "4", "--pp", "4", "--cp", "2", "--ep", "4"],
        }
        for name, args in layouts.items():
            plan = json.loads(subprocess.run([mpu, "plan", "--format", "json", "--per-rank"] + args,
                                             capture_output=True, text=True, check=True).stdout)

            def groups_of(r, plan=plan):
                # a kind the layout does not build (amax without --fp8) lists no groups and is not drawn
                return {k: next((sorted(g) for g in gs if r in g), None)
                        for k, gs in plan["groups"].items() if gs}

            def getters(r, plan=plan):
                return plan["per_rank"][r]

            rank = 5 if name != "core_order" else 13
            f = check_page(chromium, tmp, "plan_" + name, [mpu, "plan", "--format", "html"] + args,
                           groups_of, getters, rank, 2, os.path.join(out, "plan_%s.png" % name))
            failures += f
            passes += not f
        mesh = json.loads(subprocess.run([mpu, "mesh", "--shape", "2,2,4", "--names", "pp,dp,tp",
                                          "--format", "json"], capture_output=True, text=True,
                                         check=True).stdout)

        def mesh_groups(r):
            return {d["name"]: next(sorted(g) for g in d["groups"] if r in g) for d in mesh["dims"]}

        def mesh_coords(r):
            return {"rank": r, "coords": [r // 8, r // 4 % 2, r % 4]}

        f = check_page(chromium, tmp, "mesh", [mpu, "mesh", "--shape", "2,2,4", "--names", "pp,dp,tp",
                                               "--format", "html"], mesh_groups, mesh_coords, 6, 9,
                       os.path.join(out, "mesh.png"))
        failures += f
        passes += not f
        f = check_svg(chromium, tmp, "schedule", [mpu, "plan", "--schedule", "interleaved", "--pp", "4",
                                                  "--vp", "2", "--micro-batches", "8", "--format", "svg"],
                      os.path.join(out, "schedule.png"))
        failures += f
        passes += not f
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for line in failures:
        print("FAIL " + line)
    print("%d passed, %d failed (screenshots in %s)" % (passes, len(failures), out))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
