// The login page: POST /api/auth/login (JSON), then go to ?next= if it is a path on this
// site. Messages are set with textContent only.

// A same-origin destination, or "/": never another host, scheme or protocol-relative URL.
export function safeNext(raw) {
  if (typeof raw !== "string" || !raw.startsWith("/") || raw.startsWith("//") ||
      raw.startsWith("/\\") || /[\u0000-\u001f\\]/.test(raw)) {
    return "/";
  }
  let url;
  try {
    url = new URL(raw, window.location.origin);
  } catch {
    return "/";
  }
  if (url.origin !== window.location.origin || url.pathname.startsWith("/login")) return "/";
  return url.pathname + url.search + url.hash;
}

const form = document.getElementById("login-form");
const error = document.getElementById("login-error");
const button = document.getElementById("login-submit");

form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  error.textContent = "";
  button.disabled = true;
  const next = safeNext(new URLSearchParams(window.location.search).get("next") || "/");
  try {
    const r = await fetch("/api/auth/login", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      credentials: "same-origin",
      body: JSON.stringify({
        username: document.getElementById("username").value.trim(),
        password: document.getElementById("password").value,
        next,
      }),
    });
    if (r.ok) {
      const data = await r.json();
      window.location.assign(safeNext(data.next || next));
      return;
    }
    if (r.status === 429) {
      error.textContent = "Too many failed sign-ins. Wait a few minutes and try again.";
    } else if (r.status === 401) {
      error.textContent = "Invalid username or password.";
    } else {
      error.textContent = `Sign-in failed (HTTP ${r.status}).`;
    }
  } catch (e) {
    error.textContent = "Cannot reach paralab.";
  } finally {
    button.disabled = false;
  }
});
