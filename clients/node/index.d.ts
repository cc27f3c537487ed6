// Types of idem-pg (hand-written; the package has no build step).
import type { Pool, PoolClient, QueryResult, QueryResultRow } from 'pg';

/** What a request is reduced to for the fingerprint. */
export interface CanonicalRequest {
  method: string;
  /** The path with its query string. */
  path: string;
  /** A parsed JSON body (canonicalised), a string or Buffer (as is), or nothing. */
  body?: unknown;
}

/** An HTTP answer as the library produces and stores it. */
export interface IdemResponse {
  status: number;
  /** Lower-case header names. */
  headers: Record<string, string | string[] | number>;
  body: Buffer | null;
}

export interface LeaseInfo {
  /** The lease's proof of ownership; kept by the middleware, passed to idem_checkpoint / idem_complete. */
  token: string;
  /** 1 for a first run, 2 and more after a takeover of a lease that ran out. */
  attempt: number;
  /** The last recovery point a previous attempt recorded (null on a first run). */
  recoveryPoint: string | null;
  recoveryData: unknown;
  until: string | null;
}

/** The request's idempotency context: req.idem (Express), request.idem (Fastify), idem.current(). */
export interface IdemContext {
  /** The connection holding the claim's transaction: do the business writes on it. */
  client: PoolClient;
  query<R extends QueryResultRow = any>(text: string, values?: unknown[]): Promise<QueryResult<R>>;
  /** The claimed key (tenant-scoped), or null on a route whose key is optional and was not sent. */
  key: string | null;
  /** The Idempotency-Key header as sent. */
  clientKey: string | null;
  bizType: string;
  /** idem_claim's row: claimed, state, result. */
  claim: { claimed: boolean; state: string; result: any } | null;
  /** Lease mode only. */
  lease: LeaseInfo | null;
  /** Lease mode only: record a recovery point (committed at once; renews the lease). */
  checkpoint(point: string, data?: unknown): Promise<void>;
  /** The framework's request object. */
  request: unknown;
  route: RouteOptions;
  finished: boolean;
}

export interface IdemHooks {
  /** After the response is stored, before COMMIT. */
  beforeCommit?(ctx: IdemContext): void | Promise<void>;
  /** After COMMIT, before the response is sent. */
  afterCommit?(ctx: IdemContext): void | Promise<void>;
}

export interface Options {
  /** Header carrying the key (default "Idempotency-Key"). */
  keyHeader?: string;
  /** Accepted keys (default: 16 to 255 visible ASCII characters); others get 400. */
  keyPattern?: RegExp;
  /** false: a request without the key runs without a claim (still in one transaction). Default true (400). */
  required?: boolean;
  /** true (default): a concurrent duplicate waits for the first and gets its outcome; false: 409 + Retry-After. */
  wait?: boolean;
  /** Bound of that wait in milliseconds (lock_timeout; 55P03 becomes 503). 0: unbounded. Default 5000. */
  lockTimeout?: number;
  /** Retry-After seconds on 409 and 503 (default 1). */
  retryAfter?: number;
  /** Lease mode: seconds of the lease (the claim commits before the handler runs). Default null. */
  lease?: number | null;
  /** Which statuses are stored and replayed (default: below 500); others roll back. */
  store?(status: number): boolean;
  /** Response headers stored with the response (default content-type, location). */
  storeHeaders?: string[];
  /** Bodies larger than this (bytes) are sent but not stored; a replay says Idempotent-Body-Omitted. Default 65536. */
  maxStoredBody?: number;
  /** Body fields ("name" or "dotted.path") left out of the fingerprint. */
  excludeFields?: string[];
  /** Replaces the computed fingerprint (return null for none). */
  fingerprint?(req: any): string | null | Promise<string | null>;
  /** The tenant of the authenticated principal: the key is scoped "tenant:key". */
  tenant?(req: any): string | null | undefined | Promise<string | null | undefined>;
  /** Base URI of the problem types in error bodies. */
  problemBase?: string;
  hooks?: IdemHooks;
}

export interface RouteOptions extends Options {
  /** The operation: idem's biz_type (^[A-Za-z0-9_.:-]{1,64}$). */
  bizType: string;
}

export interface CreateOptions extends Options {
  pool: Pool;
  /** Schema of the extension's functions when it is not on the search_path. */
  schema?: string;
}

export type ExpressMiddleware = (req: any, res: any, next: (err?: unknown) => void) => void;
export type ExpressErrorHandler = (err: unknown, req: any, res: any, next: (err?: unknown) => void) => void;
export type FastifyPlugin = (fastify: any, opts: Record<string, unknown>, done: (err?: Error) => void) => void;

export declare class Idem {
  constructor(options: CreateOptions);
  readonly pool: Pool;
  readonly defaults: Options;
  /** The context of the request being handled (AsyncLocalStorage). */
  current(): IdemContext | undefined;
  route(options: RouteOptions): RouteOptions;
  begin(req: { method: string; path: string; headers: Record<string, any>; body?: unknown }, route: RouteOptions, raw: unknown):
    Promise<{ response: IdemResponse; ctx?: undefined } | { ctx: IdemContext; response?: undefined }>;
  finish(ctx: IdemContext, response: { status: number; headers: Record<string, any>; body: Buffer | null; streamed?: boolean }):
    Promise<{ response?: IdemResponse }>;
  responseForError(route: RouteOptions, err: unknown): IdemResponse | null;
  /** Express per-route middleware. */
  express(options: RouteOptions): ExpressMiddleware;
  /** Express error handler: transient database errors become 503 + Retry-After. */
  expressErrorHandler(): ExpressErrorHandler;
  /** Fastify plugin; routes opt in with config: { idem: RouteOptions }. */
  readonly fastify: FastifyPlugin;
}

export declare function createIdem(options: CreateOptions): Idem;
export declare function expressMiddleware(idem: Idem, options: RouteOptions): ExpressMiddleware;
export declare function expressErrorHandler(idem: Idem): ExpressErrorHandler;
export declare const idemFastify: FastifyPlugin;
export declare function canonicalJson(value: unknown): string;
export declare function canonicalRequest(req: CanonicalRequest, excludeFields?: string[]): string;
/** 32 hex digits of SHA-256 over canonicalRequest. */
export declare function fingerprint(req: CanonicalRequest, excludeFields?: string[]): string;
export declare function isTransient(err: unknown): boolean;
export declare function isConnectionError(err: unknown): boolean;
export declare const TRANSIENT_SQLSTATES: ReadonlySet<string>;
export declare function replay(result: unknown): IdemResponse;
