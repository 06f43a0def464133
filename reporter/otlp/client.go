package otlp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/profiles/v1development"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// client makes single export calls; retrying is the Exporter's business.
type client struct {
	conn     *grpc.ClientConn
	timeout  time.Duration
	md       metadata.MD
	callOpts []grpc.CallOption
}

func newClient(cfg Config, userAgent string) (*client, error) {
	addr, plaintext, err := cfg.target()
	if err != nil {
		return nil, err
	}
	var creds credentials.TransportCredentials
	if plaintext {
		creds = insecure.NewCredentials()
	} else {
		tc, err := tlsConfig(cfg)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	var callOpts []grpc.CallOption
	switch cfg.Compression {
	case CompressionGzip:
		callOpts = append(callOpts, grpc.UseCompressor(statelessGzip{}.Name()))
	case CompressionNone:
	default:
		return nil, fmt.Errorf("compression %q is neither gzip nor none", cfg.Compression)
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent(userAgent),
		// gRPC waits up to 2 minutes between reconnections by default, during which
		// every export fails at once: a collector back from an outage would get
		// nothing for that long. Reconnect on the exporter's own retry schedule.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				BaseDelay:  cfg.RetryInitial,
				Multiplier: 2,
				Jitter:     0.2,
				MaxDelay:   cfg.RetryMax,
			},
			MinConnectTimeout: cfg.Timeout,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	c := &client{
		conn:     conn,
		timeout:  cfg.Timeout,
		callOpts: callOpts,
	}
	if len(cfg.Headers) > 0 {
		c.md = metadata.New(cfg.Headers)
	}
	return c, nil
}

func tlsConfig(cfg Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CertFile != "" {
		pem, err := os.ReadFile(cfg.CertFile)
		if err != nil {
			return nil, fmt.Errorf("read CA certificates: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("read CA certificates: no PEM certificate in %s", cfg.CertFile)
		}
		tc.RootCAs = pool
	}
	if (cfg.ClientCert == "") != (cfg.ClientKey == "") {
		return nil, errors.New("client certificate and key go together: set both or neither")
	}
	if cfg.ClientCert != "" {
		pair, err := tls.LoadX509KeyPair(cfg.ClientCert, cfg.ClientKey)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// export sends a request already marshaled.
func (c *client) export(ctx context.Context, req []byte) (*collectorpb.ExportProfilesServiceResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if c.md != nil {
		ctx = metadata.NewOutgoingContext(ctx, c.md)
	}
	resp := new(collectorpb.ExportProfilesServiceResponse)
	opts := append([]grpc.CallOption{grpc.ForceCodecV2(rawCodec{})}, c.callOpts...)
	if err := c.conn.Invoke(ctx, exportMethod, marshaled(req), resp, opts...); err != nil {
		return nil, err
	}
	return resp, nil
}

// exportMethod is the ProfilesService's Export, as the generated client names it.
const exportMethod = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"

// marshaled is a request already in wire form.
type marshaled []byte

// rawCodec sends marshaled requests as they are and reads the export's response by
// hand, the same way (see MarshalRequest): the reflection behind proto.Marshal and
// proto.Unmarshal is not on the path of every interval. Other messages go through proto.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(marshaled); ok {
		return mem.BufferSlice{mem.SliceBuffer(m)}, nil
	}
	msg, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("otlp: cannot marshal %T", v)
	}
	b, err := proto.Marshal(msg)
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if resp, ok := v.(*collectorpb.ExportProfilesServiceResponse); ok {
		return unmarshalResponse(data.Materialize(), resp)
	}
	msg, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("otlp: cannot unmarshal into %T", v)
	}
	return proto.Unmarshal(data.Materialize(), msg)
}

// Name keeps the content type application/grpc+proto.
func (rawCodec) Name() string { return "proto" }

func (c *client) close() error { return c.conn.Close() }

// classify says whether a failed export may succeed when tried again, and how long
// the collector asked to wait first (0 when it did not say). The codes are those the
// OTLP specification calls retryable; ResourceExhausted only with a RetryInfo, since
// without one the collector is refusing the data rather than asking to slow down.
func classify(err error) (retry bool, wait time.Duration) {
	st, ok := status.FromError(err)
	if !ok {
		// Not from gRPC at all, e.g. a local failure to marshal: trying again won't help.
		return false, 0
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			wait = ri.GetRetryDelay().AsDuration()
			if wait < 0 {
				wait = 0
			}
			break
		}
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Aborted, codes.OutOfRange,
		codes.Unavailable, codes.DataLoss:
		return true, wait
	case codes.ResourceExhausted:
		return hasRetryInfo(st), wait
	default:
		return false, 0
	}
}

func hasRetryInfo(st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			return true
		}
	}
	return false
}
