// latchkey's status page: fetch status.json every second and show it.
// Every value goes into the page as text (textContent), never as markup:
// lock names come from clients.
"use strict";

function text(id, value) {
  document.getElementById(id).textContent = value === null || value === undefined ? "-" : String(value);
}

function row(cells, className) {
  const tr = document.createElement("tr");
  if (className) tr.className = className;
  for (const cell of cells) {
    const td = document.createElement("td");
    td.textContent = cell === null || cell === undefined ? "-" : String(cell);
    tr.appendChild(td);
  }
  return tr;
}

function render(s) {
  const node = s.node;
  text("node-id", node.id);
  text("state", node.state);
  text("ready", s.ready ? "yes" : "no: " + s.not_ready);
  text("leader", node.leader_id);
  text("term", node.term);
  text("last-log", node.last_log_index);
  text("applied", node.last_applied);
  text("snapshot", node.snapshot_index);
  text("sessions", s.sessions === null ? "unknown" : s.sessions);
  text("waiting", s.waiting_calls);
  text("detail", node.detail || "");

  const members = document.getElementById("members");
  members.replaceChildren();
  for (const m of node.members) {
    const leads = m.id === node.leader_id;
    const role = leads ? "leader" : (m.voter ? "voter" : "learner");
    const behind = m.matched_index !== null && m.matched_index < node.last_log_index;
    members.appendChild(row(
      [m.id, role, m.peer_addr, m.client_addr, m.incarnation, m.matched_index],
      leads ? "leader" : (behind ? "behind" : "")));
  }

  const locks = document.getElementById("locks");
  locks.replaceChildren();
  if (s.locks === null) {
    text("locks-note", s.locks_hidden);
    return;
  }
  text("locks-note", s.locks.length === 0 ? "No lock is in use." :
    (s.locks_more ? "The first " + s.locks.length + " locks in use, by name." : ""));
  for (const l of s.locks) {
    const holders = l.holders.map(h => h.session + ": " + h.token).join(", ");
    const delay = l.lock_delay ? l.lock_delay.delay_ms + " ms" : "";
    locks.appendChild(row([l.name, l.mode || "", holders, l.waiters, delay]));
  }
}

async function refresh() {
  try {
    const reply = await fetch("status.json", { cache: "no-store" });
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    render(await reply.json());
    text("error", "");
    text("updated", "Updated " + new Date().toLocaleTimeString() + ".");
  } catch (e) {
    text("error", "Cannot reach this replica: " + e.message);
  }
}

refresh();
setInterval(refresh, 1000);
