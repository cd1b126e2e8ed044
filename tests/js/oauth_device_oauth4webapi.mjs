// oauth4webapi 3's device requests (RFC 8628) against this server: discovery from the Matrix
// path, registration for the device grant alone (no redirect URI), deviceAuthorizationRequest,
// deviceCodeGrantRequest polled as RFC 8628 3.5 says (slow_down adds 5 s), the tokens used and
// refreshed, the used code refused, a denied code. The person's part is the driver's: this
// script prints {"verify": URL, "user_code": CODE, "user": NAME, "allow": true|false} and keeps
// polling. Prints {"result": facts} last.
// Usage: node oauth_device_oauth4webapi.mjs <base url> <user>
import * as oauth from "oauth4webapi";

const [base, user] = process.argv.slice(2);
const insecure = { [oauth.allowInsecureRequests]: true };
const out = {};
const say = (line) => console.log(JSON.stringify(line));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code";

try {
  const issuer = new URL(base.replace(/\/?$/, "/"));
  const as = await oauth.processDiscoveryResponse(issuer, await fetch(new URL("/_matrix/client/v1/auth_metadata", base)));
  out.advertised = typeof as.device_authorization_endpoint === "string" && as.grant_types_supported.includes(DEVICE_GRANT);
  const registered = await oauth.dynamicClientRegistrationRequest(as, {
    application_type: "native", client_name: "oauth4webapi device test", client_uri: "https://oauth4webapi.example.org/",
    grant_types: [DEVICE_GRANT, "refresh_token"], token_endpoint_auth_method: "none",
  }, insecure);
  const client = await oauth.processDynamicClientRegistrationResponse(registered);
  const auth = oauth.None();
  const ask = async (deviceId) => oauth.processDeviceAuthorizationResponse(as, client,
    await oauth.deviceAuthorizationRequest(as, client, auth,
      { scope: `urn:matrix:client:api:* urn:matrix:client:device:${deviceId}` }, insecure));
  const poll = async (code) => {
    try {
      return { tokens: await oauth.processDeviceCodeResponse(as, client,
        await oauth.deviceCodeGrantRequest(as, client, auth, code, insecure)) };
    } catch (e) {
      if (e instanceof oauth.ResponseBodyError) return { error: e.error, status: e.status };
      throw e;
    }
  };
  const until = async (code) => {  // RFC 8628 3.5: wait interval; slow_down adds 5 s
    let interval = 5;
    for (;;) {
      await sleep(interval * 1000);
      const answer = await poll(code);
      if (answer.error === "slow_down") interval += 5;
      else if (answer.error !== "authorization_pending") return answer;
    }
  };

  const deviceId = "O4WDEV" + Math.random().toString(36).slice(2, 7).toUpperCase();
  const first = await ask(deviceId);
  out.codes = { user_code: first.user_code, interval: first.interval, expires_in: first.expires_in,
                complete: first.verification_uri_complete };
  // Two polls at once: pending, then slow_down.
  out.quick_polls = [(await poll(first.device_code)).error, (await poll(first.device_code)).error];
  say({ verify: first.verification_uri_complete, user_code: first.user_code, user, allow: true });
  const got = await until(first.device_code);
  out.token = got.tokens ? { token_type: got.tokens.token_type, scope: got.tokens.scope,
                             refresh: typeof got.tokens.refresh_token === "string" } : got;
  if (got.tokens) {
    const res = await oauth.protectedResourceRequest(got.tokens.access_token, "GET",
      new URL("/_matrix/client/v3/account/whoami", base), undefined, undefined, insecure);
    const me = await res.json();
    out.whoami = [res.status, me.user_id, me.device_id];
    const refreshed = await oauth.processRefreshTokenResponse(as, client,
      await oauth.refreshTokenGrantRequest(as, client, auth, got.tokens.refresh_token, insecure));
    out.refreshed = refreshed.access_token !== got.tokens.access_token;
    await sleep(5000);
    out.used_again = (await poll(first.device_code)).error ?? "granted twice";
  }
  out.device_id = deviceId;

  const second = await ask(deviceId + "X");
  say({ verify: second.verification_uri, user_code: second.user_code, user, allow: false });
  out.denied = (await until(second.device_code)).error ?? "granted";
} catch (e) {
  out.failed = { name: e.name, code: e.code, error: e.error, message: e.message, status: e.status };
}
say({ result: out });
