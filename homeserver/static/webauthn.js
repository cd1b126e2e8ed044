// Passkeys on the account page and the sign-in's second step: the project's only script.
//
// A button `<button type="button" data-webauthn="create|get" data-webauthn-options="{…}">`
// inside a form asks the browser for a new passkey (create) or for one of the person's
// passkeys (get), with the options the server rendered (homeserver/mfa/passkeys.py, JSON),
// then puts the answer, the PublicKeyCredential as JSON with base64url bytes, into the form's
// hidden input `credential` (or the one `data-webauthn-field` names) and submits the form.
// A problem is said in the form's `[data-webauthn-error]` element, if it has one.
//
// Loaded as `<script src="…/webauthn.js" defer>` under `script-src 'self'`: no inline code,
// no eval, no inline styles, no innerHTML.
(function () {
  "use strict";

  function toBytes(text) {
    var base64 = text.replace(/-/g, "+").replace(/_/g, "/");
    while (base64.length % 4) {
      base64 += "=";
    }
    var binary = atob(base64);
    var bytes = new Uint8Array(binary.length);
    for (var i = 0; i < binary.length; i++) {
      bytes[i] = binary.charCodeAt(i);
    }
    return bytes.buffer;
  }

  function toText(buffer) {
    if (buffer === null || buffer === undefined) {
      return null;
    }
    var bytes = new Uint8Array(buffer);
    var binary = "";
    for (var i = 0; i < bytes.length; i++) {
      binary += String.fromCharCode(bytes[i]);
    }
    return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function descriptors(list) {
    return (list || []).map(function (item) {
      var copy = { type: item.type, id: toBytes(item.id) };
      if (item.transports) {
        copy.transports = item.transports;
      }
      return copy;
    });
  }

  // The JSON options as the WebAuthn calls take them (their bytes as ArrayBuffers). Newer
  // browsers parse them themselves; the rest by hand.
  function creationOptions(json) {
    if (PublicKeyCredential.parseCreationOptionsFromJSON) {
      return PublicKeyCredential.parseCreationOptionsFromJSON(json);
    }
    var options = Object.assign({}, json);
    options.challenge = toBytes(json.challenge);
    options.user = Object.assign({}, json.user, { id: toBytes(json.user.id) });
    options.excludeCredentials = descriptors(json.excludeCredentials);
    return options;
  }

  function requestOptions(json) {
    if (PublicKeyCredential.parseRequestOptionsFromJSON) {
      return PublicKeyCredential.parseRequestOptionsFromJSON(json);
    }
    var options = Object.assign({}, json);
    options.challenge = toBytes(json.challenge);
    options.allowCredentials = descriptors(json.allowCredentials);
    return options;
  }

  // The answer as JSON, the shape of PublicKeyCredential.toJSON() (where it exists, used).
  function answer(credential) {
    if (typeof credential.toJSON === "function") {
      return credential.toJSON();
    }
    var response = credential.response;
    var json = {
      id: credential.id,
      rawId: toText(credential.rawId),
      type: credential.type,
      authenticatorAttachment: credential.authenticatorAttachment || null,
      clientExtensionResults: credential.getClientExtensionResults(),
      response: { clientDataJSON: toText(response.clientDataJSON) }
    };
    if (response.attestationObject) {
      json.response.attestationObject = toText(response.attestationObject);
      json.response.transports = response.getTransports ? response.getTransports() : [];
    } else {
      json.response.authenticatorData = toText(response.authenticatorData);
      json.response.signature = toText(response.signature);
      json.response.userHandle = toText(response.userHandle);
    }
    return json;
  }

  function say(form, text) {
    var place = form.querySelector("[data-webauthn-error]");
    if (place) {
      place.textContent = text;
      place.hidden = false;
    }
  }

  function explain(error) {
    if (error && error.name === "NotAllowedError") {
      return "The passkey was not used: the request was cancelled, timed out, or no passkey of yours answered.";
    }
    if (error && error.name === "InvalidStateError") {
      return "This passkey is added already.";
    }
    if (error && error.name === "SecurityError") {
      return "This page's address cannot use passkeys.";
    }
    return "The passkey could not be used (" + (error && error.name ? error.name : "error") + ").";
  }

  function start(button) {
    var form = button.form;
    var field = form && form.elements.namedItem(button.getAttribute("data-webauthn-field") || "credential");
    if (!form || !field) {
      return;
    }
    if (!window.PublicKeyCredential || !navigator.credentials) {
      button.disabled = true;
      say(form, "This browser cannot use passkeys.");
      return;
    }
    button.addEventListener("click", function (event) {
      event.preventDefault();
      var json = JSON.parse(button.getAttribute("data-webauthn-options"));
      var create = button.getAttribute("data-webauthn") === "create";
      var request = create
        ? navigator.credentials.create({ publicKey: creationOptions(json) })
        : navigator.credentials.get({ publicKey: requestOptions(json) });
      button.disabled = true;
      request.then(function (credential) {
        field.value = JSON.stringify(answer(credential));
        form.submit();
      }).catch(function (error) {
        button.disabled = false;
        say(form, explain(error));
      });
    });
  }

  function ready() {
    var buttons = document.querySelectorAll("button[data-webauthn]");
    for (var i = 0; i < buttons.length; i++) {
      start(buttons[i]);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
