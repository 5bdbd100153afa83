// A real OpenID provider (the npm package oidc-provider) on loopback for the gateway's identity tests.
//
//   node tests/oidc/provider.mjs CONFIG.json
//
// CONFIG.json (written by tests/support/oidc_provider.py): {"port": N (0: any), "resource": "<the gateway's
// resource identifier>", "jwks": {"keys": [private JWKs; the first signs]}, "clients": [client
// metadata], "users": {"<login>": {"email": "...", "groups": [...]}}, "client_groups": {"<client id>":
// [...]}, "access_token_ttl": seconds}; a user may carry "extra" claims for its ID token (say "idtyp").
// Prints one line "READY <issuer>" once it listens; key rotation is a restart on the same port with a new
// first key (or, same port, new users: a person whose email changed).
import { readFileSync } from "node:fs";
import http from "node:http";
import Provider, { errors } from "oidc-provider";

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const server = http.createServer();
await new Promise((resolve) => server.listen(config.port || 0, "127.0.0.1", resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;
const resource = config.resource;
const users = config.users || {};
const clientGroups = config.client_groups || {};

const provider = new Provider(issuer, {
  clients: config.clients,
  jwks: config.jwks,
  findAccount: async (_ctx, id) => {
    const user = users[id];
    if (!user) return undefined;
    return {
      accountId: id,
      claims: async () => ({ ...(user.extra || {}), sub: id, email: user.email, groups: user.groups }),
    };
  },
  claims: { openid: ["sub", "idtyp"], email: ["email"], groups: ["groups"] },
  scopes: ["openid", "email", "groups", "vsphere:read", "vsphere:write", "vsphere:destructive"],
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  ttl: { AccessToken: config.access_token_ttl || 300, ClientCredentials: config.access_token_ttl || 300 },
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: (ctx) => (ctx.oidc.client && ctx.oidc.client.clientId === config.web_client ? undefined : resource),
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, indicator) => {
        if (indicator !== resource) throw new errors.InvalidTarget();
        return {
          scope: "vsphere:read vsphere:write vsphere:destructive",
          audience: resource,
          accessTokenFormat: "jwt",
          accessTokenTTL: config.access_token_ttl || 300,
          jwt: { sign: { alg: "RS256" } },
        };
      },
    },
  },
  extraTokenClaims: async (_ctx, token) => {
    if (token.kind === "ClientCredentials") return { groups: clientGroups[token.clientId] || [] };
    if (token.accountId && users[token.accountId]) return { groups: users[token.accountId].groups };
    return undefined;
  },
});
provider.on("server_error", (_ctx, err) => console.error("server_error", err));
server.on("request", provider.callback());
console.log(`READY ${issuer}`);
