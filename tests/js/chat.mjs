// Two real matrix-js-sdk clients talk through the proxy; a second login of the receiver is a
// device of its own. Mode "e2ee": in an encrypted room, with js-sdk's Rust crypto
// (@matrix-org/matrix-sdk-crypto-wasm, in-memory stores), each device with keys of its own.
// Prints one JSON line of facts for the test to check.
// Usage: node chat.mjs plain|e2ee <base url> <sender> <sender password> <receiver> <receiver password>
import * as sdk from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";

logger.disableAll();
// matrix-js-sdk 43 wants Node 22 (its package.json): Promise.withResolvers is the one thing
// Node 20 lacks that it uses; without it the sync loop stops after the first sync.
Promise.withResolvers ??= function withResolvers() {
  let resolve, reject;
  const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
  return { promise, resolve, reject };
};
const [mode, base, aliceName, alicePassword, bobName, bobPassword] = process.argv.slice(2);
const e2ee = mode === "e2ee";
const out = {};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitFor(what, check, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(200);
  }
}

async function start(user, password) {
  const bare = sdk.createClient({ baseUrl: base });
  const login = await bare.loginRequest({ type: "m.login.password", identifier: { type: "m.id.user", user }, password });
  const client = sdk.createClient({
    baseUrl: base, accessToken: login.access_token, userId: login.user_id, deviceId: login.device_id,
  });
  if (e2ee) await client.initRustCrypto({ useIndexedDB: false });
  const prepared = new Promise((resolve) => client.on(sdk.ClientEvent.Sync, (state) => state === "PREPARED" && resolve()));
  await client.startClient({ initialSyncLimit: 20 });
  await prepared;
  return client;
}

function plaintexts(client, roomId) {
  const room = client.getRoom(roomId);
  if (!room) return [];
  return room.getLiveTimeline().getEvents()
    .filter((e) => e.getType() === "m.room.message")
    .map((e) => ({ body: e.getContent().body, wire: e.getWireType(), sender: e.getSender(),
                   failed: e.isDecryptionFailure() }));
}

async function received(client, roomId, body) {
  return waitFor(`${client.getUserId()}/${client.getDeviceId()} to decrypt "${body}"`, async () => {
    const room = client.getRoom(roomId);
    for (const e of room ? room.getLiveTimeline().getEvents() : []) await client.decryptEventIfNeeded(e);
    return plaintexts(client, roomId).find((m) => m.body === body);
  });
}

// What a client like Element Web asks first: no OAuth 2.0 (so password login), and the flows.
const probe = sdk.createClient({ baseUrl: base });
try { await probe.getAuthMetadata(); out.auth_metadata = "advertised"; }
catch (e) { out.auth_metadata = [e.httpStatus, e.errcode]; }
out.flows = (await probe.loginFlows()).flows.map((f) => f.type);

const alice = await start(aliceName, alicePassword);
const bob = await start(bobName, bobPassword);
try {
  const aliceId = alice.getUserId(), bobId = bob.getUserId();
  const encryption = { type: "m.room.encryption", state_key: "", content: { algorithm: "m.megolm.v1.aes-sha2" } };
  const { room_id: roomId } = await alice.createRoom({
    name: mode, invite: [bobId], initial_state: e2ee ? [encryption] : [],
  });
  await waitFor("the invite", () => bob.getRoom(roomId)?.getMyMembership() === "invite");
  await bob.joinRoom(roomId);
  await waitFor("bob joined, seen by alice", () => alice.getRoom(roomId)?.getMember(bobId)?.membership === "join");
  out.encrypted_room = e2ee && await alice.getCrypto().isEncryptionEnabledInRoom(roomId);
  if (e2ee) {
    // Cross-signing set up as Element does at a first login: the first upload of the keys
    // needs no password step (there is none under delegation).
    await alice.getCrypto().bootstrapCrossSigning({ authUploadDeviceSigningKeys: (makeRequest) => makeRequest(null) });
    out.cross_signing_ready = await alice.getCrypto().isCrossSigningReady();
  }

  await alice.sendTextMessage(roomId, "first secret");
  out.first = await received(bob, roomId, "first secret");
  await bob.sendTextMessage(roomId, "and back");
  out.reply = await received(alice, roomId, "and back");

  // Each device has keys of its own: a second login of bob is a new device with new keys.
  const bob2 = await start(bobName, bobPassword);
  try {
    out.devices = [bob.getDeviceId(), bob2.getDeviceId()];
    out.device_list = (await bob2.getDevices()).devices.map((d) => d.device_id).sort();
    if (e2ee) {
      const own = [await bob.getCrypto().getOwnDeviceKeys(), await bob2.getCrypto().getOwnDeviceKeys()];
      const seen = await waitFor("alice to see both of bob's devices", async () => {
        const map = (await alice.getCrypto().getUserDeviceInfo([bobId], true)).get(bobId);
        return map && map.size === 2 ? map : null;
      });
      out.keys_seen_by_alice = out.devices.map((id) => [seen.get(id)?.getIdentityKey(), seen.get(id)?.getFingerprint()]);
      out.own_keys = own.map((k) => [k.curve25519, k.ed25519]);
    }
    await alice.sendTextMessage(roomId, "second secret");
    out.second_on_bob = await received(bob, roomId, "second secret");
    out.second_on_bob2 = await received(bob2, roomId, "second secret");
    // What Synapse stored: ciphertext only.
    const raw = await alice.createMessagesRequest(roomId, null, 20, sdk.Direction.Backward);
    out.wire_types = [...new Set(raw.chunk.filter((e) => e.sender === aliceId && e.state_key === undefined)
      .map((e) => e.type))];
    out.plaintext_on_server = JSON.stringify(raw.chunk).includes("secret");
    // The second device logs out (POST /logout, routed to this server): Synapse refuses its
    // token from the next request on.
    const token = bob2.getAccessToken();
    await bob2.logout(true);
    const stale = sdk.createClient({ baseUrl: base, accessToken: token, userId: bobId });
    try { await stale.whoami(); out.after_logout = "still valid"; }
    catch (e) { out.after_logout = [e.httpStatus, e.errcode]; }
  } finally {
    bob2.stopClient();
  }
} finally {
  alice.stopClient();
  bob.stopClient();
}
console.log(JSON.stringify(out));
process.exit(0);
