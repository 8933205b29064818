/* chatsite chat page: the WebSocket (protocol: docs/websocket-protocol.md). Reconnects with exponential
 * back-off (1, 2, 4 ... 15 s), stops on 4401/4403 (signed out); 1013 (try again later: the server is
 * briefly unavailable) keeps backing off although the socket had opened. Exposes window.Chat.Socket. */
(() => {
  'use strict';
  const Chat = (window.Chat = window.Chat || {});

  class Socket {
    /** handlers: {frame(m), open(), close(event, {final})} */
    constructor(path, handlers) {
      this.path = path;
      this.handlers = handlers;
      this.ws = null;
      this.attempts = 0;
      this.timer = null;
      window.addEventListener('online', () => {
        if (!this.ws) { this.attempts = Math.max(this.attempts, 1); this.connect(); }
      });
    }

    get open() { return this.ws?.readyState === WebSocket.OPEN; }

    /** Send a frame now; false when the socket is not open (the caller keeps it for `open`). */
    send(frame) {
      if (!this.open) return false;
      this.ws.send(JSON.stringify(frame));
      return true;
    }

    connect() {
      clearTimeout(this.timer);
      this.handlers.status?.(this.attempts ? 'reconnecting' : 'connecting');
      const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
      const ws = new WebSocket(`${scheme}://${location.host}${this.path}`);
      this.ws = ws;
      const attempts = this.attempts;
      ws.addEventListener('open', () => {
        this.attempts = 0;
        this.handlers.status?.('open');
        this.handlers.open?.();
      });
      ws.addEventListener('message', (ev) => {
        let m;
        try { m = JSON.parse(ev.data); } catch { return; }
        if (m && typeof m.type === 'string') this.handlers.frame(m);
      });
      ws.addEventListener('close', (ev) => {
        if (this.ws !== ws) return;
        this.ws = null;
        const final = ev.code === 4401 || ev.code === 4403;
        this.handlers.close?.(ev, { final });
        if (final) { this.handlers.status?.('closed'); return; }
        const unavailable = ev.code === 1013;
        if (unavailable) this.attempts = Math.max(this.attempts, attempts); // opened, but refused for now
        const delay = Math.min(15, 2 ** this.attempts);
        this.attempts += 1;
        this.handlers.status?.(unavailable ? 'unavailable' : 'reconnecting');
        this.timer = setTimeout(() => this.connect(), delay * 1000);
      });
    }
  }

  Chat.Socket = Socket;
})();
